/* The ingest body's fast path, compiled: ``{"context": {...}, "events": [...]}`` read in
 * one pass into the batch's columns (ingest.core wraps it; docs/benchmarks.md measured why).
 *
 * decode(body, message, stack, attrs, attr) -> tuple | None
 *
 * It takes only a body that ingest's Python path (ingest.wire + ingest.events) would store
 * column by column, as sent, with nothing cut and nothing rejected, and returns exactly
 * the columns that path makes of it. For anything else (a malformed or unknown field, a
 * value over a limit, an escape it does not take, a nested attribute) it returns None,
 * having judged nothing, and the body goes down the Python path, which is the reference
 * for every rule: a decline costs a rare body a second reading, never a different answer.
 * tests/ingest/test_core.py checks both paths give the same rows, byte for byte, over
 * generated and arbitrary bodies.
 *
 * The tuple: (events, context, ts, ts_min, ts_max, level, message, url, missing_urls,
 * attrs, error_type, error_message, error_stack):
 * - context: the context object's bytes as sent (None when absent), for msgspec to read;
 * - ts: epoch milliseconds (ints), with their least and greatest: the range check needs
 *   the time of receipt, which the caller knows;
 * - url: None where absent, null or empty (missing_urls counts them): the context's URL
 *   stands in for them;
 * - attrs: the object's text as sent, or None;
 * - error_*: None when no event has an error, else one value (or None) per event.
 *
 * The input is chosen by whoever holds the public ingest key: every read is bounds
 * checked, nothing recurses without a depth limit, and the work is linear in the body.
 * `make fuzz` runs it under AddressSanitizer and UBSan.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* What a step returns: go on, give the body to the Python path, or a Python error
 * (memory) is set. */
enum { OK = 0, DECLINE = 1, FAILED = -1, MORE = 2 };

/* A skipped value (the context) nests no deeper than this; past it, the Python path. */
#define MAX_DEPTH 32
/* Numbers the Python path would send to its per-event path: an exponent of three digits
 * or more, or this many digits and points in a row (ingest.events._NUMBER_SHAPES). */
#define LONG_DIGITS 200

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
    Py_ssize_t message_limit, stack_limit, attrs_limit, attr_limit;
} Reader;


static inline void skip_ws(Reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static inline int peek(Reader *r) { return r->p < r->end ? *r->p : -1; }

static int expect(Reader *r, char c) {
    skip_ws(r);
    if (peek(r) != c)
        return DECLINE;
    r->p++;
    return OK;
}

/* After a member or an item: MORE past a ',' (another follows), OK past the ``close``
 * that ends the object or array, else DECLINE. */
static int next(Reader *r, char close) {
    skip_ws(r);
    if (peek(r) == ',') {
        r->p++;
        return MORE;
    }
    return expect(r, close);
}

static int hex4(const unsigned char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return DECLINE;
    }
    *out = v;
    return OK;
}

/* At a backslash: the escape's code point, *p moved past it. A lone surrogate declines
 * (the Python path repairs it: ingest.surrogates). */
static int escape(Reader *r, unsigned *cp) {
    if (r->end - r->p < 2)
        return DECLINE;
    unsigned char c = r->p[1];
    r->p += 2;
    switch (c) {
    case '"': *cp = '"'; return OK;
    case '\\': *cp = '\\'; return OK;
    case '/': *cp = '/'; return OK;
    case 'b': *cp = '\b'; return OK;
    case 'f': *cp = '\f'; return OK;
    case 'n': *cp = '\n'; return OK;
    case 'r': *cp = '\r'; return OK;
    case 't': *cp = '\t'; return OK;
    case 'u': break;
    default: return DECLINE;
    }
    unsigned hi, lo;
    if (r->end - r->p < 4 || hex4(r->p, &hi) != OK)
        return DECLINE;
    r->p += 4;
    if (hi < 0xD800 || hi > 0xDFFF) {
        *cp = hi;
        return OK;
    }
    if (hi > 0xDBFF || r->end - r->p < 6 || r->p[0] != '\\' || r->p[1] != 'u'
            || hex4(r->p + 2, &lo) != OK || lo < 0xDC00 || lo > 0xDFFF)
        return DECLINE;
    r->p += 6;
    *cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
    return OK;
}

/* The end of the plain run at p: the first '"', '\\' or control character (or end).
 * Sets *high if a byte of the run is not ASCII. Sixteen bytes at a time where SSE2 is
 * (every x86-64): strings are most of a body's bytes. */
static inline const unsigned char *plain_run(const unsigned char *p, const unsigned char *end,
                                             int *high) {
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'),
                  control = _mm_set1_epi8(0x1f);
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        /* Unsigned v <= 0x1f: min(v, 0x1f) == v. */
        __m128i stop = _mm_or_si128(
            _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
            _mm_cmpeq_epi8(_mm_min_epu8(v, control), v));
        int mask = _mm_movemask_epi8(stop);
        if (mask) {
            int before = (1 << __builtin_ctz(mask)) - 1;
            *high |= _mm_movemask_epi8(v) & before;
            return p + __builtin_ctz(mask);
        }
        *high |= _mm_movemask_epi8(v);
        p += 16;
    }
#endif
    while (p < end && *p != '"' && *p != '\\' && *p >= 0x20) {
        *high |= *p >= 0x80;
        p++;
    }
    return p;
}

/* At a string's opening quote: move past its closing one. Escapes are checked as
 * string() reads them; the bytes' UTF-8 is left to the caller. */
static int skip_string(Reader *r) {
    int high = 0;
    r->p++;
    for (;;) {
        r->p = plain_run(r->p, r->end, &high);
        if (r->p >= r->end || *r->p < 0x20)
            return DECLINE;
        if (*r->p == '"') {
            r->p++;
            return OK;
        }
        unsigned cp;
        if (escape(r, &cp) != OK)
            return DECLINE;
    }
}

/* The batch's string columns as Arrow lays them out: the values' bytes end to end, int32
 * offsets (rows + 1 of them) and a validity bitmap (bit set: a value; clear: null). */
typedef struct {
    char *data;
    Py_ssize_t size, cap;
    int32_t *offsets;
    Py_ssize_t rows, rows_cap;
    uint8_t *valid;
    Py_ssize_t nulls;
} Column;

static int column_rows(Column *c) {
    if (c->rows + 2 <= c->rows_cap)
        return OK;
    Py_ssize_t cap = c->rows_cap ? c->rows_cap * 2 : 128;
    int32_t *offsets = PyMem_RawRealloc(c->offsets, (size_t)cap * sizeof(int32_t));
    if (offsets == NULL)
        goto nomemory;
    c->offsets = offsets;
    uint8_t *valid = PyMem_RawRealloc(c->valid, (size_t)(cap + 7) / 8);
    if (valid == NULL)
        goto nomemory;
    c->valid = valid;
    if (c->rows_cap == 0)
        c->offsets[0] = 0;
    c->rows_cap = cap;
    return OK;
nomemory:
    return FAILED;
}

/* Room for ``extra`` more bytes of values. */
static int column_reserve(Column *c, Py_ssize_t extra) {
    if (c->size + extra <= c->cap && c->data != NULL)
        return OK;
    if (c->size + extra > INT32_MAX)
        return DECLINE; /* past int32 offsets: the Python path (a body of 2 GiB or more) */
    Py_ssize_t cap = c->cap ? c->cap : 1024;
    while (cap < c->size + extra)
        cap *= 2;
    char *data = PyMem_RawRealloc(c->data, (size_t)cap);
    if (data == NULL)
        return FAILED;
    c->data = data;
    c->cap = cap;
    return OK;
}

/* Ends the row: the bytes written since the last one are its value (or it is null). */
static int column_end(Column *c, int valid) {
    int rc = column_rows(c);
    if (rc != OK)
        return rc;
    Py_ssize_t i = c->rows++;
    c->offsets[c->rows] = (int32_t)c->size;
    if (i % 8 == 0)
        c->valid[i / 8] = 0;
    if (valid)
        c->valid[i / 8] |= (uint8_t)(1u << (i % 8));
    else
        c->nulls++;
    return OK;
}

static int column_null(Column *c) { return column_end(c, 0); }

/* Bytes onto the row being written (it stays open). */
static int append(Column *c, const char *bytes, Py_ssize_t n) {
    int rc = column_reserve(c, n);
    if (rc != OK)
        return rc;
    memcpy(c->data + c->size, bytes, (size_t)n);
    c->size += n;
    return OK;
}

static int column_put(Column *c, const char *bytes, Py_ssize_t n) {
    int rc = append(c, bytes, n);
    return rc != OK ? rc : column_end(c, 1);
}

static void column_free(Column *c) {
    PyMem_RawFree(c->data);
    PyMem_RawFree(c->offsets);
    PyMem_RawFree(c->valid);
}

/* (offsets, data, validity or None when no value is null) as bytes. */
static PyObject *column_bytes(Column *c) {
    if (column_rows(c) != OK)
        return PyErr_NoMemory();
    PyObject *valid = c->nulls ? PyBytes_FromStringAndSize((const char *)c->valid,
                                                           (c->rows + 7) / 8)
                               : Py_NewRef(Py_None);
    if (valid == NULL)
        return NULL;
    return Py_BuildValue("(y#y#N)", (const char *)c->offsets,
                         (Py_ssize_t)((c->rows + 1) * sizeof(int32_t)),
                         c->data ? c->data : "", c->size, valid);
}

/* Code points in ``s`` if it is UTF-8 as Python's strict decoder takes it (no overlong
 * form, no surrogate, nothing past U+10FFFF, nothing cut short), else -1. */
static Py_ssize_t utf8_points(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t points = 0, i = 0;
    while (i < n) {
        unsigned char c = s[i];
        points++;
        if (c < 0x80) {
            i++;
            continue;
        }
        unsigned char lo = 0x80, hi = 0xBF;
        int more;
        if (c >= 0xC2 && c <= 0xDF) {
            more = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return -1;
        }
        if (n - i <= more || s[i + 1] < lo || s[i + 1] > hi)
            return -1;
        for (int k = 2; k <= more; k++) {
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return -1;
        }
        i += more + 1;
    }
    return points;
}

/* A string into column ``c`` (unescaped), if within ``limit`` (code points times four:
 * the Python path's own test, ingest.events); bytes that are not UTF-8 decline (msgspec
 * refuses them). ``limit`` < 0: none. */
static int string(Reader *r, Column *c, Py_ssize_t limit) {
    const unsigned char *start = ++r->p;
    int high = 0, rc;
    r->p = plain_run(r->p, r->end, &high);
    if (r->p >= r->end || *r->p < 0x20)
        return DECLINE;
    if ((rc = column_reserve(c, r->p - start)) != OK)
        return rc;
    char *w = c->data + c->size;
    memcpy(w, start, (size_t)(r->p - start));
    w += r->p - start;
    if (*r->p == '\\') {
        /* Escaped: unescaped into the column, never longer than the escaped text. */
        Reader probe = *r;
        probe.p = start - 1;
        if (skip_string(&probe) != OK)
            return DECLINE;
        const unsigned char *close = probe.p - 1;
        Py_ssize_t written = w - c->data;
        if ((rc = column_reserve(c, close - start)) != OK)
            return rc;
        w = c->data + written;
        while (r->p < close) {
            const unsigned char *run = plain_run(r->p, close, &high);
            memcpy(w, r->p, (size_t)(run - r->p));
            w += run - r->p;
            r->p = run;
            if (r->p >= close)
                break;
            unsigned cp;
            if (escape(r, &cp) != OK)
                return DECLINE;
            if (cp < 0x80) {
                *w++ = (char)cp;
                continue;
            }
            high = 1;
            if (cp < 0x800) {
                *w++ = (char)(0xC0 | (cp >> 6));
                *w++ = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                *w++ = (char)(0xE0 | (cp >> 12));
                *w++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *w++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *w++ = (char)(0xF0 | (cp >> 18));
                *w++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                *w++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *w++ = (char)(0x80 | (cp & 0x3F));
            }
        }
    }
    r->p++; /* the closing quote */
    const unsigned char *value = (const unsigned char *)c->data + c->size;
    Py_ssize_t n = w - (char *)value;
    Py_ssize_t points = high ? utf8_points(value, n) : n;
    if (points < 0 || (limit >= 0 && points * 4 > limit))
        return DECLINE;
    c->size += n;
    return column_end(c, 1);
}

/* A number as JSON writes it (msgspec refuses '01', '1.', '.5', '+1'). */
static int skip_number(Reader *r) {
    if (peek(r) == '-')
        r->p++;
    if (peek(r) == '0') {
        r->p++;
    } else if (peek(r) >= '1' && peek(r) <= '9') {
        while (peek(r) >= '0' && peek(r) <= '9') r->p++;
    } else {
        return DECLINE;
    }
    if (peek(r) == '.') {
        r->p++;
        if (!(peek(r) >= '0' && peek(r) <= '9')) return DECLINE;
        while (peek(r) >= '0' && peek(r) <= '9') r->p++;
    }
    if (peek(r) == 'e' || peek(r) == 'E') {
        r->p++;
        if (peek(r) == '+' || peek(r) == '-') r->p++;
        if (!(peek(r) >= '0' && peek(r) <= '9')) return DECLINE;
        while (peek(r) >= '0' && peek(r) <= '9') r->p++;
    }
    return OK;
}

static int literal(Reader *r, const char *word, size_t n) {
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0)
        return DECLINE;
    r->p += n;
    return OK;
}

/* A string, number, true, false or null; an object or array declines. */
static int skip_scalar(Reader *r) {
    switch (peek(r)) {
    case '"': return skip_string(r);
    case 't': return literal(r, "true", 4);
    case 'f': return literal(r, "false", 5);
    case 'n': return literal(r, "null", 4);
    default: return skip_number(r);
    }
}

static int skip_value(Reader *r, int depth) {
    skip_ws(r);
    int c = peek(r);
    if (c != '{' && c != '[')
        return skip_scalar(r);
    if (depth >= MAX_DEPTH)
        return DECLINE;
    r->p++;
    char close = c == '{' ? '}' : ']';
    skip_ws(r);
    if (peek(r) == close) {
        r->p++;
        return OK;
    }
    for (;;) {
        if (c == '{') {
            skip_ws(r);
            if (peek(r) != '"' || skip_string(r) != OK || expect(r, ':') != OK)
                return DECLINE;
        }
        if (skip_value(r, depth + 1) != OK)
            return DECLINE;
        int rc = next(r, close);
        if (rc != MORE)
            return rc;
    }
}

/* Is the digit or point at s[i - 1] followed by an exponent that may put its number out
 * of float range: e or E, an optional '+', three digits or points or more, then an end
 * of number? (ingest.events._BIG_EXPONENT, on the bytes as its translation folds them.) */
static int big_exponent(const unsigned char *s, Py_ssize_t i, Py_ssize_t n) {
    Py_ssize_t j = i + 1, digits = 0;
    if (j < n && s[j] == '+')
        j++;
    for (; j < n && ((s[j] >= '0' && s[j] <= '9') || s[j] == '.'); j++)
        digits++;
    return digits >= 3 && j < n && s[j] != 0 && strchr(",}] \t\r\n", s[j]) != NULL;
}

/* Would the Python path take this attrs text as sent? (ingest.events._raw_attrs: one
 * '{', no '[', within the limits, no number that could be out of float range, UTF-8.)
 * Sets *ascii. A run of LONG_DIGITS digits needs that many bytes: shorter texts (most)
 * only look for exponents after a digit, sixteen bytes at a time. */
static int attrs_as_sent(Reader *r, const unsigned char *s, Py_ssize_t n, int *ascii) {
    if (n > r->attr_limit || n > 5 * r->attrs_limit)
        return DECLINE;
    Py_ssize_t i = 1; /* past the opening brace */
    int high = 0, after_digit = 0;
#ifdef __SSE2__
    if (n < LONG_DIGITS) {
        const __m128i zero = _mm_set1_epi8('0'), nine = _mm_set1_epi8('9'),
                      point = _mm_set1_epi8('.'), brace = _mm_set1_epi8('{'),
                      bracket = _mm_set1_epi8('['), lower = _mm_set1_epi8(0x20),
                      e = _mm_set1_epi8('e');
        for (; n - i >= 16; i += 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
            __m128i digit = _mm_or_si128(
                _mm_cmpeq_epi8(_mm_min_epu8(_mm_max_epu8(v, zero), nine), v),
                _mm_cmpeq_epi8(v, point));
            __m128i open = _mm_or_si128(_mm_cmpeq_epi8(v, brace), _mm_cmpeq_epi8(v, bracket));
            if (_mm_movemask_epi8(open))
                return DECLINE;
            high |= _mm_movemask_epi8(v);
            unsigned digits = (unsigned)_mm_movemask_epi8(digit);
            unsigned es = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_or_si128(v, lower), e));
            /* An e or E right after a digit or point (the last of the block before, too). */
            unsigned candidates = es & ((digits << 1) | (unsigned)after_digit);
            while (candidates) {
                if (big_exponent(s, i + __builtin_ctz(candidates), n))
                    return DECLINE;
                candidates &= candidates - 1;
            }
            after_digit = (digits >> 15) & 1;
        }
    }
#endif
    Py_ssize_t run = after_digit;
    for (; i < n; i++) {
        unsigned char c = s[i];
        high |= c >= 0x80;
        if (c == '{' || c == '[')
            return DECLINE;
        if ((c >= '0' && c <= '9') || c == '.') {
            if (++run >= LONG_DIGITS)
                return DECLINE;
            continue;
        }
        if (run && (c == 'e' || c == 'E') && big_exponent(s, i, n))
            return DECLINE;
        run = 0;
    }
    *ascii = !high;
    return OK;
}

/* An attrs object of scalars, its text as sent into column ``c``. */
static int attrs(Reader *r, Column *c) {
    const unsigned char *start = r->p++;
    skip_ws(r);
    if (peek(r) == '}') {
        r->p++;
    } else {
        for (;;) {
            skip_ws(r);
            if (peek(r) != '"' || skip_string(r) != OK || expect(r, ':') != OK)
                return DECLINE;
            skip_ws(r);
            if (skip_scalar(r) != OK)
                return DECLINE;
            int rc = next(r, '}');
            if (rc == OK)
                break;
            if (rc != MORE)
                return rc;
        }
    }
    int ascii;
    Py_ssize_t n = r->p - start;
    if (attrs_as_sent(r, start, n, &ascii) != OK || (!ascii && utf8_points(start, n) < 0))
        return DECLINE;
    return column_put(c, (const char *)start, n);
}

typedef struct {
    const char *text;
    size_t size;
} Name;
#define NAME(s) {s, sizeof(s) - 1}

/* A member's name, unescaped and UTF-8, and its colon. */
static int name(Reader *r, const unsigned char **start, Py_ssize_t *n) {
    skip_ws(r);
    if (peek(r) != '"')
        return DECLINE;
    *start = ++r->p;
    int high = 0;
    r->p = plain_run(r->p, r->end, &high);
    if (r->p >= r->end || *r->p != '"')
        return DECLINE;
    *n = r->p - *start;
    r->p++;
    if (high && utf8_points(*start, *n) < 0)
        return DECLINE;
    return expect(r, ':');
}

/* A key, unescaped only: one of ``names`` (its index), and its colon; else decline. */
static int key(Reader *r, const Name *names, int count, int *index) {
    const unsigned char *start;
    Py_ssize_t n;
    if (name(r, &start, &n) != OK)
        return DECLINE;
    for (int i = 0; i < count; i++) {
        if (names[i].size == (size_t)n && memcmp(names[i].text, start, (size_t)n) == 0) {
            *index = i;
            return OK;
        }
    }
    return DECLINE;
}

/* A string or null into column ``c``. */
static int optional_string(Reader *r, Column *c, Py_ssize_t limit) {
    skip_ws(r);
    if (peek(r) == 'n')
        return literal(r, "null", 4) == OK ? column_null(c) : DECLINE;
    if (peek(r) != '"')
        return DECLINE;
    return string(r, c, limit);
}

/* An epoch-milliseconds integer; a float, a string or null declines. */
static int timestamp(Reader *r, long long *out) {
    skip_ws(r);
    long long v = 0;
    int digits = 0;
    if (!(peek(r) >= '1' && peek(r) <= '9'))
        return DECLINE;
    while (peek(r) >= '0' && peek(r) <= '9') {
        if (++digits > 15)
            return DECLINE;
        v = v * 10 + (*r->p++ - '0');
    }
    int c = peek(r);
    if (c == '.' || c == 'e' || c == 'E')
        return DECLINE;
    *out = v;
    return OK;
}

static const Name LEVEL_NAMES[4] = {NAME("debug"), NAME("info"), NAME("warn"), NAME("error")};

static int level(Reader *r, Column *c) {
    skip_ws(r);
    if (peek(r) != '"')
        return DECLINE;
    const unsigned char *start = ++r->p;
    while (r->p < r->end && *r->p != '"' && *r->p != '\\')
        r->p++;
    if (r->p >= r->end || *r->p != '"')
        return DECLINE;
    size_t n = (size_t)(r->p - start);
    r->p++;
    for (int i = 0; i < 4; i++) {
        if (LEVEL_NAMES[i].size == n && memcmp(LEVEL_NAMES[i].text, start, n) == 0)
            return column_put(c, LEVEL_NAMES[i].text, (Py_ssize_t)n);
    }
    return DECLINE; /* "warning", "Info"...: the Python path maps them */
}

typedef struct {
    Column level, message, url, attrs, error[3]; /* error: type, message, stack */
    int64_t *ts;
    Py_ssize_t ts_cap;
    long long ts_min, ts_max;
    Py_ssize_t events, missing_urls;
    int errors; /* the error columns exist: some event has had an error */
} Columns;

static void columns_free(Columns *c) {
    column_free(&c->level);
    column_free(&c->message);
    column_free(&c->url);
    column_free(&c->attrs);
    for (int i = 0; i < 3; i++)
        column_free(&c->error[i]);
    PyMem_RawFree(c->ts);
}

/* The error columns, made at the first event with an error: null for the events before. */
static int error_columns(Columns *c) {
    if (c->errors)
        return OK;
    c->errors = 1;
    for (int i = 0; i < 3; i++) {
        for (Py_ssize_t j = 0; j < c->events; j++) {
            int rc = column_null(&c->error[i]);
            if (rc != OK)
                return rc;
        }
    }
    return OK;
}

/* The event's columns are written: its ts goes in, and it counts. */
static int event_done(Columns *c, long long ts) {
    if (c->events + 1 > c->ts_cap) {
        Py_ssize_t cap = c->ts_cap ? c->ts_cap * 2 : 128;
        int64_t *grown = PyMem_RawRealloc(c->ts, (size_t)cap * sizeof(int64_t));
        if (grown == NULL)
            return FAILED;
        c->ts = grown;
        c->ts_cap = cap;
    }
    c->ts[c->events] = ts;
    c->ts_min = c->events == 0 || ts < c->ts_min ? ts : c->ts_min;
    c->ts_max = c->events == 0 || ts > c->ts_max ? ts : c->ts_max;
    c->events++;
    return OK;
}

static int error_info(Reader *r, Columns *c) {
    static const Name names[3] = {NAME("type"), NAME("message"), NAME("stack")};
    Py_ssize_t limit[3] = {r->attr_limit, r->message_limit, r->stack_limit};
    int seen = 0, rc;
    if ((rc = error_columns(c)) != OK)
        return rc;
    r->p++;
    skip_ws(r);
    if (peek(r) != '}') {
        for (;;) {
            int i;
            if ((rc = key(r, names, 3, &i)) != OK)
                return rc;
            if (seen & (1 << i))
                return DECLINE; /* msgspec keeps the last of duplicates: not worth the case */
            seen |= 1 << i;
            if ((rc = optional_string(r, &c->error[i], limit[i])) != OK)
                return rc;
            if ((rc = next(r, '}')) == OK)
                break;
            if (rc != MORE)
                return rc;
        }
    } else {
        r->p++;
    }
    for (int i = 0; i < 3; i++) {
        if (!(seen & (1 << i)) && (rc = column_null(&c->error[i])) != OK)
            return rc;
    }
    return OK;
}

enum { K_TS, K_LEVEL, K_MESSAGE, K_URL, K_ATTRS, K_ERROR };

static int event(Reader *r, Columns *c) {
    static const Name names[6] = {NAME("ts"), NAME("level"), NAME("message"), NAME("url"),
                                  NAME("attrs"), NAME("error")};
    long long ts = 0;
    int seen = 0, rc;
    Py_ssize_t url_size = c->url.size;

    if (expect(r, '{') != OK)
        return DECLINE;
    skip_ws(r);
    if (peek(r) == '}')
        return DECLINE; /* no message */
    for (;;) {
        int i;
        if ((rc = key(r, names, 6, &i)) != OK)
            return rc;
        if (seen & (1 << i))
            return DECLINE;
        seen |= 1 << i;
        skip_ws(r);
        switch (i) {
        case K_TS: rc = timestamp(r, &ts); break;
        case K_LEVEL: rc = level(r, &c->level); break;
        case K_MESSAGE:
            rc = peek(r) == '"' ? string(r, &c->message, r->message_limit) : DECLINE;
            break;
        case K_URL: rc = optional_string(r, &c->url, r->message_limit); break;
        case K_ATTRS: rc = peek(r) == '{' ? attrs(r, &c->attrs) : DECLINE; break;
        default: /* K_ERROR */
            if (peek(r) == '{') {
                rc = error_info(r, c);
            } else {
                seen &= ~(1 << K_ERROR); /* null: no error */
                rc = literal(r, "null", 4);
            }
            break;
        }
        if (rc != OK)
            return rc;
        if ((rc = next(r, '}')) == OK)
            break;
        if (rc != MORE)
            return rc;
    }
    if (!(seen & (1 << K_TS)) || !(seen & (1 << K_MESSAGE)))
        return DECLINE;
    if (!(seen & (1 << K_LEVEL)) && (rc = column_put(&c->level, "info", 4)) != OK)
        return rc;
    if (!(seen & (1 << K_URL)) && (rc = column_null(&c->url)) != OK)
        return rc;
    Py_ssize_t last = c->url.rows - 1;
    if ((c->url.valid[last / 8] >> (last % 8)) & 1 && c->url.size == url_size) {
        /* An empty URL is a missing one: null, for the context's to stand in. */
        c->url.valid[last / 8] &= (uint8_t)~(1u << (last % 8));
        c->url.nulls++;
    }
    if (!((c->url.valid[last / 8] >> (last % 8)) & 1))
        c->missing_urls++;
    if (!(seen & (1 << K_ATTRS)) && (rc = column_null(&c->attrs)) != OK)
        return rc;
    if (c->errors && !(seen & (1 << K_ERROR))) {
        for (int i = 0; i < 3; i++) {
            if ((rc = column_null(&c->error[i])) != OK)
                return rc;
        }
    }
    return event_done(c, ts);
}

static int events(Reader *r, Columns *c) {
    if (expect(r, '[') != OK)
        return DECLINE;
    skip_ws(r);
    if (peek(r) == ']') {
        r->p++;
        return OK;
    }
    for (;;) {
        int rc = event(r, c);
        if (rc != OK || (rc = next(r, ']')) != MORE)
            return rc;
    }
}

/* The body; *context: where its context object's text is (NULL: none). Runs without the
 * GIL: it touches no Python object (FAILED: out of memory). */
static int body(Reader *r, Columns *c, const unsigned char **context, Py_ssize_t *context_size) {
    static const Name names[2] = {NAME("events"), NAME("context")};
    int seen = 0;
    if (expect(r, '{') != OK)
        return DECLINE;
    skip_ws(r);
    if (peek(r) == '}')
        return DECLINE; /* no events */
    for (;;) {
        int i, rc;
        if ((rc = key(r, names, 2, &i)) != OK)
            return rc;
        if (seen & (1 << i))
            return DECLINE;
        seen |= 1 << i;
        if (i == 0) {
            if ((rc = events(r, c)) != OK)
                return rc;
        } else {
            skip_ws(r);
            const unsigned char *start = r->p;
            if (peek(r) != '{' || skip_value(r, 0) != OK)
                return DECLINE;
            *context = start;
            *context_size = r->p - start;
        }
        if ((rc = next(r, '}')) == MORE)
            continue;
        if (rc != OK)
            return rc;
        skip_ws(r);
        return seen & 1 && r->p == r->end ? OK : DECLINE;
    }
}

static PyObject *decode(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer view;
    Reader r = {0};
    Columns c = {0};
    PyObject *context = NULL, *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nnnn", &view, &r.message_limit, &r.stack_limit,
                          &r.attrs_limit, &r.attr_limit))
        return NULL;
    r.p = view.buf;
    r.end = r.p + view.len;
    const unsigned char *context_at = NULL;
    Py_ssize_t context_size = 0;
    int rc;
    /* The body is read into C buffers alone: other threads run Python meanwhile (the
     * flushes, the WAL's writer), where holding the GIL would stall them. */
    Py_BEGIN_ALLOW_THREADS
    rc = body(&r, &c, &context_at, &context_size);
    Py_END_ALLOW_THREADS
    if (rc == FAILED)
        PyErr_NoMemory();
    if (rc == OK && context_at != NULL) {
        context = PyBytes_FromStringAndSize((const char *)context_at, context_size);
        if (context == NULL)
            rc = FAILED;
    }
    if (rc == OK) {
        PyObject *cols[7] = {NULL};
        Column *from[7] = {&c.level, &c.message, &c.url, &c.attrs, &c.error[0], &c.error[1],
                           &c.error[2]};
        int failed = 0;
        for (int i = 0; i < 7; i++) {
            cols[i] = i >= 4 && !c.errors ? Py_NewRef(Py_None) : column_bytes(from[i]);
            failed |= cols[i] == NULL;
        }
        if (!failed)
            result = Py_BuildValue(
                "(nOy#LLOOOnOOOO)", c.events, context ? context : Py_None,
                c.ts ? (const char *)c.ts : "", (Py_ssize_t)(c.events * sizeof(int64_t)),
                c.ts_min, c.ts_max, cols[0], cols[1], cols[2], c.missing_urls, cols[3],
                cols[4], cols[5], cols[6]);
        for (int i = 0; i < 7; i++)
            Py_XDECREF(cols[i]);
    } else if (rc == DECLINE) {
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&view);
    columns_free(&c);
    Py_XDECREF(context);
    return result;
}

/* --- Sentry's log items ---------------------------------------------------------------
 *
 * logs(payload, message, attrs, attr, max_tags, min_ts) -> tuple | None
 *
 * A log item's container, ``{"items": [{"timestamp", "level", "body", "attributes"}]}``,
 * read as ingest.envelope._typed_logs reads it (fields it ignores are skipped, but must be
 * JSON and UTF-8), into the same columns: level mapped as Sentry names them, ``body`` as
 * message, seconds as milliseconds, and attrs written as msgspec writes
 * ``{name: value}`` again. It declines whatever that path would write otherwise or judge:
 * a missing or out-of-range timestamp, an unknown level, escapes in a name or a string
 * value, a number msgspec would print another way, a duplicate name, more than
 * ``max_tags`` attributes, a value over its limit. The tuple: (events, release, ts,
 * ts_min, ts_max, level, message, attrs), release the first ``sentry.release`` string. */

/* A value of a field the Python path ignores: JSON, and UTF-8 (msgspec's reading). */
static int skip_checked(Reader *r) {
    skip_ws(r);
    const unsigned char *start = r->p;
    if (skip_value(r, 0) != OK)
        return DECLINE;
    return utf8_points(start, r->p - start) < 0 ? DECLINE : OK;
}

static int is(const unsigned char *s, Py_ssize_t n, const char *word) {
    return (size_t)n == strlen(word) && memcmp(s, word, (size_t)n) == 0;
}

/* Seconds since the epoch as the Python path's ms: int(seconds * 1000) for a number in
 * [min_seconds, 1e13), not 0; anything else declines (the Python path keeps the row at
 * its time of receipt). */
static int seconds(Reader *r, double min_seconds, long long *out) {
    skip_ws(r);
    const unsigned char *start = r->p;
    if (skip_number(r) != OK || r->p - start > 40)
        return DECLINE;
    char text[48];
    memcpy(text, start, (size_t)(r->p - start));
    text[r->p - start] = 0;
    double value = strtod(text, NULL); /* correctly rounded, as msgspec reads it */
    if (!(value != 0.0 && value >= min_seconds && value < 1e13))
        return DECLINE;
    *out = (long long)(value * 1000.0);
    return OK;
}

static const Name SENTRY_LEVELS[8] = {NAME("fatal"), NAME("error"), NAME("warning"),
                                      NAME("warn"), NAME("info"), NAME("log"),
                                      NAME("debug"), NAME("trace")};
static const Name SENTRY_AS[8] = {NAME("error"), NAME("error"), NAME("warn"), NAME("warn"),
                                  NAME("info"), NAME("info"), NAME("debug"), NAME("debug")};

/* Sentry's level, or null or "" ("info"); another spelling ("Warning") declines. */
static int sentry_level(Reader *r, Column *c) {
    skip_ws(r);
    if (peek(r) == 'n')
        return literal(r, "null", 4) == OK ? column_put(c, "info", 4) : DECLINE;
    if (peek(r) != '"')
        return DECLINE;
    const unsigned char *start = ++r->p;
    while (r->p < r->end && *r->p != '"' && *r->p != '\\')
        r->p++;
    if (r->p >= r->end || *r->p != '"')
        return DECLINE;
    Py_ssize_t n = r->p++ - start;
    if (n == 0)
        return column_put(c, "info", 4);
    for (int i = 0; i < 8; i++) {
        if (SENTRY_LEVELS[i].size == (size_t)n && memcmp(SENTRY_LEVELS[i].text, start, n) == 0)
            return column_put(c, SENTRY_AS[i].text, (Py_ssize_t)SENTRY_AS[i].size);
    }
    return DECLINE;
}

/* Would msgspec print this number (as sent, JSON) back byte for byte? An integer of at
 * most 18 digits (not "-0"); a decimal without exponent of at most 15 significant digits,
 * no trailing zero after the first, and at most three zeros after "0." (msgspec prints
 * 1e-6 and less with an exponent). */
static int number_as_printed(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = s[0] == '-', whole = 0, fraction = 0, zeros = 0;
    while (i + whole < n && s[i + whole] >= '0' && s[i + whole] <= '9')
        whole++;
    Py_ssize_t at = i + whole;
    if (at == n)
        return whole <= 18 && !(s[0] == '-' && whole == 1 && s[1] == '0') ? OK : DECLINE;
    if (s[at] != '.')
        return DECLINE; /* an exponent */
    for (Py_ssize_t j = at + 1; j < n; j++) {
        if (s[j] < '0' || s[j] > '9')
            return DECLINE;
        fraction++;
    }
    if (fraction > 1 && s[n - 1] == '0')
        return DECLINE;
    Py_ssize_t significant = whole + fraction;
    if (whole == 1 && s[i] == '0') {
        while (zeros < fraction && s[at + 1 + zeros] == '0')
            zeros++;
        if (zeros == fraction)
            return OK; /* 0.0 */
        if (zeros > 3)
            return DECLINE;
        significant = fraction - zeros;
    }
    return significant <= 15 ? OK : DECLINE;
}

/* One attribute's typed object, ``{"value": v, "type": ...}``: v's JSON as msgspec would
 * print it again, into the attrs column's open row. *release: v's text if a string. */
static int typed_value(Reader *r, Column *c, const unsigned char **text, Py_ssize_t *text_n) {
    int seen = 0, rc;
    *text = NULL;
    if (expect(r, '{') != OK)
        return DECLINE;
    skip_ws(r);
    if (peek(r) != '}') {
        for (;;) {
            const unsigned char *field;
            Py_ssize_t field_n;
            if (name(r, &field, &field_n) != OK)
                return DECLINE;
            if (!is(field, field_n, "value")) {
                if (skip_checked(r) != OK)
                    return DECLINE;
            } else {
                if (seen)
                    return DECLINE;
                seen = 1;
                skip_ws(r);
                const unsigned char *start = r->p;
                int c0 = peek(r);
                if (c0 == '"') {
                    int high = 0;
                    r->p = plain_run(r->p + 1, r->end, &high);
                    if (r->p >= r->end || *r->p != '"')
                        return DECLINE; /* an escape: msgspec may print it otherwise */
                    r->p++;
                    if (high && utf8_points(start + 1, r->p - start - 2) < 0)
                        return DECLINE;
                    *text = start + 1;
                    *text_n = r->p - start - 2;
                } else if (c0 == 't' || c0 == 'f' || c0 == 'n') {
                    if (skip_scalar(r) != OK)
                        return DECLINE;
                } else {
                    if (skip_number(r) != OK || number_as_printed(start, r->p - start) != OK)
                        return DECLINE;
                }
                if ((rc = append(c, (const char *)start, r->p - start)) != OK)
                    return rc;
            }
            if ((rc = next(r, '}')) == OK)
                break;
            if (rc != MORE)
                return rc;
        }
    } else {
        r->p++;
    }
    return seen ? OK : append(c, "null", 4);
}

typedef struct {
    const unsigned char *release;
    Py_ssize_t release_n;
    int max_tags;
    double min_seconds;
} LogState;

/* ``attributes``: {"name": {"value": v}, ...} -> the row's attrs {"name": v, ...}. */
static int attributes(Reader *r, Column *c, LogState *st) {
    const unsigned char *names[64];
    Py_ssize_t sizes[64];
    int count = 0, rc;
    Py_ssize_t row = c->size;
    if (expect(r, '{') != OK)
        return DECLINE;
    skip_ws(r);
    if (peek(r) == '}') {
        r->p++;
        return column_null(c); /* {}: no attrs */
    }
    if ((rc = append(c, "{", 1)) != OK)
        return rc;
    for (;;) {
        const unsigned char *key;
        Py_ssize_t key_n;
        if (name(r, &key, &key_n) != OK || count >= st->max_tags || count >= 64)
            return DECLINE;
        for (int i = 0; i < count; i++) {
            if (sizes[i] == key_n && memcmp(names[i], key, (size_t)key_n) == 0)
                return DECLINE; /* a duplicate: the dict keeps the last */
        }
        names[count] = key;
        sizes[count++] = key_n;
        if ((count > 1 && (rc = append(c, ",", 1)) != OK) || (rc = append(c, "\"", 1)) != OK
                || (rc = append(c, (const char *)key, key_n)) != OK
                || (rc = append(c, "\":", 2)) != OK)
            return rc;
        const unsigned char *text;
        Py_ssize_t text_n = 0;
        if ((rc = typed_value(r, c, &text, &text_n)) != OK)
            return rc;
        if (text != NULL && st->release == NULL && is(key, key_n, "sentry.release")) {
            st->release = text;
            st->release_n = text_n;
        }
        if ((rc = next(r, '}')) == OK)
            break;
        if (rc != MORE)
            return rc;
    }
    if ((rc = append(c, "}", 1)) != OK)
        return rc;
    int ascii;
    if (attrs_as_sent(r, (const unsigned char *)c->data + row, c->size - row, &ascii) != OK)
        return DECLINE;
    return column_end(c, 1);
}

enum { L_TIMESTAMP, L_LEVEL, L_BODY, L_ATTRIBUTES };

static int log_entry(Reader *r, Columns *c, LogState *st) {
    int seen = 0, rc;
    long long ts = 0;
    if (expect(r, '{') != OK)
        return DECLINE;
    skip_ws(r);
    if (peek(r) == '}')
        return DECLINE; /* no timestamp */
    for (;;) {
        const unsigned char *field;
        Py_ssize_t n;
        int i = -1;
        if (name(r, &field, &n) != OK)
            return DECLINE;
        if (is(field, n, "timestamp")) i = L_TIMESTAMP;
        else if (is(field, n, "level")) i = L_LEVEL;
        else if (is(field, n, "body")) i = L_BODY;
        else if (is(field, n, "attributes")) i = L_ATTRIBUTES;
        if (i < 0) {
            rc = skip_checked(r);
        } else {
            if (seen & (1 << i))
                return DECLINE;
            seen |= 1 << i;
            skip_ws(r);
            switch (i) {
            case L_TIMESTAMP: rc = seconds(r, st->min_seconds, &ts); break;
            case L_LEVEL: rc = sentry_level(r, &c->level); break;
            case L_BODY:
                rc = peek(r) == '"' ? string(r, &c->message, r->message_limit) : DECLINE;
                break;
            default: rc = attributes(r, &c->attrs, st); break;
            }
        }
        if (rc != OK)
            return rc;
        if ((rc = next(r, '}')) == OK)
            break;
        if (rc != MORE)
            return rc;
    }
    if (!(seen & (1 << L_TIMESTAMP)))
        return DECLINE;
    if (!(seen & (1 << L_LEVEL)) && (rc = column_put(&c->level, "info", 4)) != OK)
        return rc;
    if (!(seen & (1 << L_BODY)) && (rc = column_put(&c->message, "", 0)) != OK)
        return rc;
    if (!(seen & (1 << L_ATTRIBUTES)) && (rc = column_null(&c->attrs)) != OK)
        return rc;
    return event_done(c, ts);
}

static int log_container(Reader *r, Columns *c, LogState *st) {
    int seen = 0, rc;
    if (expect(r, '{') != OK)
        return DECLINE;
    skip_ws(r);
    if (peek(r) == '}')
        return DECLINE; /* no items */
    for (;;) {
        const unsigned char *field;
        Py_ssize_t n;
        if (name(r, &field, &n) != OK)
            return DECLINE;
        if (!is(field, n, "items")) {
            rc = skip_checked(r);
        } else if (seen) {
            return DECLINE;
        } else {
            seen = 1;
            if (expect(r, '[') != OK)
                return DECLINE;
            skip_ws(r);
            if (peek(r) == ']')
                return DECLINE; /* no rows */
            for (;;) {
                if ((rc = log_entry(r, c, st)) != OK)
                    return rc;
                if ((rc = next(r, ']')) == OK)
                    break;
                if (rc != MORE)
                    return rc;
            }
        }
        if (rc != OK)
            return rc;
        if ((rc = next(r, '}')) == MORE)
            continue;
        if (rc != OK)
            return rc;
        skip_ws(r);
        return seen && r->p == r->end ? OK : DECLINE;
    }
}

static PyObject *logs(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer view;
    Reader r = {0};
    Columns c = {0};
    LogState st = {0};
    long long min_ts;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nnniL", &view, &r.message_limit, &r.attrs_limit,
                          &r.attr_limit, &st.max_tags, &min_ts))
        return NULL;
    st.min_seconds = (double)min_ts / 1000.0;
    r.p = view.buf;
    r.end = r.p + view.len;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = log_container(&r, &c, &st);
    Py_END_ALLOW_THREADS
    if (rc == FAILED) {
        PyErr_NoMemory();
    } else if (rc == OK) {
        PyObject *cols[3] = {column_bytes(&c.level), column_bytes(&c.message),
                             column_bytes(&c.attrs)};
        if (cols[0] && cols[1] && cols[2]) {
            PyObject *release = st.release == NULL ? Py_NewRef(Py_None)
                : PyUnicode_DecodeUTF8((const char *)st.release, st.release_n, "strict");
            if (release != NULL)
                result = Py_BuildValue(
                    "(nNy#LLOOO)", c.events, release,
                    c.ts ? (const char *)c.ts : "", (Py_ssize_t)(c.events * sizeof(int64_t)),
                    c.ts_min, c.ts_max, cols[0], cols[1], cols[2]);
        }
        for (int i = 0; i < 3; i++)
            Py_XDECREF(cols[i]);
    } else {
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&view);
    columns_free(&c);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(body, message, stack, attrs, attr): the body's columns, or None for the "
     "Python path."},
    {"logs", logs, METH_VARARGS,
     "logs(payload, message, attrs, attr, max_tags, min_ts): a Sentry log container's "
     "columns, or None for the Python path."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT, .m_name = "_core", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__core(void) { return PyModule_Create(&module); }
