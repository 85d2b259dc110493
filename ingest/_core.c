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
enum { OK = 0, DECLINE = 1, FAILED = -1 };

/* A skipped value (the context) nests no deeper than this; past it, the Python path. */
#define MAX_DEPTH 32
/* Numbers the Python path would send to its per-event path: an exponent of three digits
 * or more, or this many digits and points in a row (ingest.events._NUMBER_SHAPES). */
#define LONG_DIGITS 200

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
    char *scratch; /* unescaped string bytes */
    Py_ssize_t scratch_cap;
    Py_ssize_t message_limit, stack_limit, attrs_limit, attr_limit;
} Reader;

static PyObject *LEVELS[4]; /* "debug", "info", "warn", "error", interned */

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

/* UTF-8 bytes as a str: ASCII copied, the rest decoded; bytes that are not UTF-8
 * decline (msgspec refuses them in a string; ingest.events in attrs). */
static int text(const char *bytes, Py_ssize_t size, int ascii, PyObject **out) {
    if (ascii) {
        PyObject *s = PyUnicode_New(size, 127);
        if (s == NULL)
            return FAILED;
        memcpy(PyUnicode_DATA(s), bytes, (size_t)size);
        *out = s;
        return OK;
    }
    PyObject *s = PyUnicode_DecodeUTF8(bytes, size, NULL);
    if (s == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return FAILED;
        PyErr_Clear();
        return DECLINE;
    }
    *out = s;
    return OK;
}

static int grow(Reader *r, Py_ssize_t need) {
    if (need <= r->scratch_cap)
        return OK;
    Py_ssize_t cap = r->scratch_cap ? r->scratch_cap : 256;
    while (cap < need)
        cap *= 2;
    char *bigger = PyMem_Realloc(r->scratch, (size_t)cap);
    if (bigger == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    r->scratch = bigger;
    r->scratch_cap = cap;
    return OK;
}

/* A string as a Python str. */
static int string(Reader *r, PyObject **out) {
    const unsigned char *start = ++r->p;
    int high = 0;
    r->p = plain_run(r->p, r->end, &high);
    if (r->p >= r->end || *r->p < 0x20)
        return DECLINE;
    if (*r->p == '"') {
        r->p++;
        return text((const char *)start, r->p - 1 - start, !high, out);
    }
    /* Escaped: unescaped into scratch, never longer than the escaped text. */
    Reader probe = *r;
    probe.p = start - 1;
    if (skip_string(&probe) != OK)
        return DECLINE;
    const unsigned char *close = probe.p - 1;
    if (grow(r, close - start) != OK)
        return FAILED;
    char *w = r->scratch;
    memcpy(w, start, (size_t)(r->p - start));
    w += r->p - start;
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
    r->p++; /* the closing quote */
    return text(r->scratch, w - r->scratch, !high, out);
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
        skip_ws(r);
        if (peek(r) == ',') {
            r->p++;
            continue;
        }
        if (peek(r) == close) {
            r->p++;
            return OK;
        }
        return DECLINE;
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

/* An attrs object of scalars as its text as sent. */
static int attrs(Reader *r, PyObject **out) {
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
            skip_ws(r);
            if (peek(r) == ',') {
                r->p++;
                continue;
            }
            if (peek(r) == '}') {
                r->p++;
                break;
            }
            return DECLINE;
        }
    }
    int ascii;
    if (attrs_as_sent(r, start, r->p - start, &ascii) != OK)
        return DECLINE;
    return text((const char *)start, r->p - start, ascii, out);
}

typedef struct {
    const char *text;
    size_t size;
} Name;
#define NAME(s) {s, sizeof(s) - 1}

/* A key, unescaped only: one of ``names`` (its index), and its colon; else decline. */
static int key(Reader *r, const Name *names, int count, int *index) {
    skip_ws(r);
    if (peek(r) != '"')
        return DECLINE;
    const unsigned char *start = ++r->p;
    int high = 0;
    r->p = plain_run(r->p, r->end, &high);
    if (r->p >= r->end || *r->p != '"')
        return DECLINE;
    size_t n = (size_t)(r->p - start);
    r->p++;
    for (int i = 0; i < count; i++) {
        if (names[i].size == n && memcmp(names[i].text, start, n) == 0) {
            *index = i;
            return expect(r, ':');
        }
    }
    return DECLINE;
}

/* A string or null (*out stays NULL). */
static int optional_string(Reader *r, PyObject **out) {
    skip_ws(r);
    if (peek(r) == 'n')
        return literal(r, "null", 4);
    if (peek(r) != '"')
        return DECLINE;
    return string(r, out);
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

static int level(Reader *r, PyObject **out) {
    static const Name names[4] = {NAME("debug"), NAME("info"), NAME("warn"), NAME("error")};
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
        if (names[i].size == n && memcmp(names[i].text, start, n) == 0) {
            *out = Py_NewRef(LEVELS[i]);
            return OK;
        }
    }
    return DECLINE; /* "warning", "Info"...: the Python path maps them */
}

/* Code points times four over a limit: the Python path's own test (ingest.events). */
static inline int over(PyObject *s, Py_ssize_t limit) {
    return s != NULL && PyUnicode_GET_LENGTH(s) * 4 > limit;
}

typedef struct {
    PyObject *ts, *level, *message, *url, *attrs, *error_type, *error_message, *error_stack;
    long long ts_min, ts_max;
    Py_ssize_t events, missing_urls;
} Columns;

/* Appends ``value`` (a new reference, or NULL for None) to ``list``. */
static int append(PyObject *list, PyObject *value) {
    int rc = PyList_Append(list, value ? value : Py_None);
    Py_XDECREF(value);
    return rc < 0 ? FAILED : OK;
}

static int error_info(Reader *r, PyObject **type, PyObject **message, PyObject **stack) {
    static const Name names[3] = {NAME("type"), NAME("message"), NAME("stack")};
    PyObject **slots[3] = {type, message, stack};
    int seen = 0;
    r->p++;
    skip_ws(r);
    if (peek(r) == '}') {
        r->p++;
        return OK;
    }
    for (;;) {
        int i, rc;
        if ((rc = key(r, names, 3, &i)) != OK)
            return rc;
        if (seen & (1 << i))
            return DECLINE; /* msgspec keeps the last of duplicates: not worth the case */
        seen |= 1 << i;
        if ((rc = optional_string(r, slots[i])) != OK)
            return rc;
        skip_ws(r);
        if (peek(r) == ',') {
            r->p++;
            continue;
        }
        return expect(r, '}');
    }
}

enum { K_TS, K_LEVEL, K_MESSAGE, K_URL, K_ATTRS, K_ERROR };

static int event(Reader *r, Columns *c) {
    static const Name names[6] = {NAME("ts"), NAME("level"), NAME("message"), NAME("url"),
                                  NAME("attrs"), NAME("error")};
    PyObject *lvl = NULL, *message = NULL, *url = NULL, *attrs_text = NULL;
    PyObject *etype = NULL, *emessage = NULL, *estack = NULL;
    long long ts = 0;
    int seen = 0, has_error = 0, rc = DECLINE;

    if (expect(r, '{') != OK)
        return DECLINE;
    skip_ws(r);
    if (peek(r) == '}')
        return DECLINE; /* no message */
    for (;;) {
        int i;
        if ((rc = key(r, names, 6, &i)) != OK)
            goto done;
        rc = DECLINE;
        if (seen & (1 << i))
            goto done;
        seen |= 1 << i;
        skip_ws(r);
        switch (i) {
        case K_TS: rc = timestamp(r, &ts); break;
        case K_LEVEL: rc = level(r, &lvl); break;
        case K_MESSAGE: rc = peek(r) == '"' ? string(r, &message) : DECLINE; break;
        case K_URL: rc = optional_string(r, &url); break;
        case K_ATTRS: rc = peek(r) == '{' ? attrs(r, &attrs_text) : DECLINE; break;
        case K_ERROR:
            if (peek(r) == '{') {
                has_error = 1;
                rc = error_info(r, &etype, &emessage, &estack);
            } else {
                rc = literal(r, "null", 4);
            }
            break;
        }
        if (rc != OK)
            goto done;
        rc = DECLINE;
        skip_ws(r);
        if (peek(r) == ',') {
            r->p++;
            continue;
        }
        if (expect(r, '}') != OK)
            goto done;
        break;
    }
    if (!(seen & (1 << K_TS)) || message == NULL || over(message, r->message_limit)
            || (url != NULL && over(url, r->message_limit))
            || over(etype, r->attr_limit) || over(emessage, r->message_limit)
            || over(estack, r->stack_limit))
        goto done;
    if (url != NULL && PyUnicode_GET_LENGTH(url) == 0)
        Py_CLEAR(url);
    if (url == NULL)
        c->missing_urls++;
    if (has_error && c->error_type == NULL) {
        /* The first event with an error: the events before it had none. */
        if (!(c->error_type = PyList_New(c->events)) || !(c->error_message = PyList_New(c->events))
                || !(c->error_stack = PyList_New(c->events))) {
            rc = FAILED;
            goto done;
        }
        for (Py_ssize_t j = 0; j < c->events; j++) {
            PyList_SET_ITEM(c->error_type, j, Py_NewRef(Py_None));
            PyList_SET_ITEM(c->error_message, j, Py_NewRef(Py_None));
            PyList_SET_ITEM(c->error_stack, j, Py_NewRef(Py_None));
        }
    }
    c->ts_min = c->events == 0 || ts < c->ts_min ? ts : c->ts_min;
    c->ts_max = c->events == 0 || ts > c->ts_max ? ts : c->ts_max;
    rc = FAILED;
    PyObject *ts_int = PyLong_FromLongLong(ts);
    if (ts_int == NULL || append(c->ts, ts_int) != OK)
        goto done;
    if (lvl == NULL)
        lvl = Py_NewRef(LEVELS[1]); /* info */
    int failed = append(c->level, lvl) | append(c->message, message) | append(c->url, url)
                 | append(c->attrs, attrs_text);
    lvl = message = url = attrs_text = NULL;
    if (c->error_type != NULL)
        failed |= append(c->error_type, etype) | append(c->error_message, emessage)
                  | append(c->error_stack, estack);
    else
        Py_XDECREF(etype), Py_XDECREF(emessage), Py_XDECREF(estack);
    etype = emessage = estack = NULL;
    if (failed)
        goto done;
    c->events++;
    rc = OK;
done:
    Py_XDECREF(lvl);
    Py_XDECREF(message);
    Py_XDECREF(url);
    Py_XDECREF(attrs_text);
    Py_XDECREF(etype);
    Py_XDECREF(emessage);
    Py_XDECREF(estack);
    return rc;
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
        if (rc != OK)
            return rc;
        skip_ws(r);
        if (peek(r) == ',') {
            r->p++;
            continue;
        }
        return expect(r, ']');
    }
}

static int body(Reader *r, Columns *c, PyObject **context) {
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
            *context = PyBytes_FromStringAndSize((const char *)start, r->p - start);
            if (*context == NULL)
                return FAILED;
        }
        skip_ws(r);
        if (peek(r) == ',') {
            r->p++;
            continue;
        }
        if (expect(r, '}') != OK)
            return DECLINE;
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
    int rc = FAILED;
    if (!(c.ts = PyList_New(0)) || !(c.level = PyList_New(0)) || !(c.message = PyList_New(0))
            || !(c.url = PyList_New(0)) || !(c.attrs = PyList_New(0)))
        goto done;
    rc = body(&r, &c, &context);
    if (rc == OK) {
        result = Py_BuildValue(
            "(nOOLLOOOnOOOO)", c.events, context ? context : Py_None, c.ts, c.ts_min,
            c.ts_max, c.level, c.message, c.url, c.missing_urls, c.attrs,
            c.error_type ? c.error_type : Py_None, c.error_message ? c.error_message : Py_None,
            c.error_stack ? c.error_stack : Py_None);
    } else if (rc == DECLINE) {
        result = Py_NewRef(Py_None);
    }
done:
    PyBuffer_Release(&view);
    PyMem_Free(r.scratch);
    Py_XDECREF(context);
    Py_XDECREF(c.ts);
    Py_XDECREF(c.level);
    Py_XDECREF(c.message);
    Py_XDECREF(c.url);
    Py_XDECREF(c.attrs);
    Py_XDECREF(c.error_type);
    Py_XDECREF(c.error_message);
    Py_XDECREF(c.error_stack);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(body, message, stack, attrs, attr): the body's columns, or None for the "
     "Python path."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT, .m_name = "_core", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__core(void) {
    static const char *const names[4] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++) {
        if (!(LEVELS[i] = PyUnicode_InternFromString(names[i])))
            return NULL;
    }
    return PyModule_Create(&module);
}
