/** Whatever a page logs becomes bounded text or scalars, and nothing throws. */

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { MAX_VALUE, cut, errorInfo, toAttrs, toText } from '../src/serialize';

const text = (v: unknown) => toText(v, 8192);

describe('toText', () => {
  test('strings as they are, other scalars as JSON would show them', () => {
    assert.equal(text('plain "quoted"'), 'plain "quoted"');
    assert.equal(text(42), '42');
    assert.equal(text(true), 'true');
    assert.equal(text(null), 'null');
    assert.equal(text(undefined), 'undefined');
    assert.equal(text(NaN), 'NaN');
    assert.equal(text({ inf: -Infinity }), '{"inf":"-Infinity"}');
  });

  test('circular references are marked, shared ones are shown in full', () => {
    const a: any = { name: 'a' };
    a.self = a;
    a.list = [a, { back: a }];
    assert.equal(text(a), '{"name":"a","self":"[Circular]","list":["[Circular]",{"back":"[Circular]"}]}');
    const shared = { x: 1 };
    assert.equal(text({ p: shared, q: shared }), '{"p":{"x":1},"q":{"x":1}}');
  });

  test('Errors show type and message, inside objects too', () => {
    assert.equal(text(new TypeError('bad thing')), 'TypeError: bad thing');
    assert.equal(text({ cause: new RangeError('r') }), '{"cause":"RangeError: r"}');
  });

  test('DOM nodes are named, not walked', () => {
    const div = { nodeType: 1, nodeName: 'DIV', id: 'app', className: ' card  big ',
                  ownerDocument: {}, parentNode: {} };
    assert.equal(text(div), '<div#app.card.big>');
    assert.equal(text({ nodeType: 1, nodeName: 'svg', id: '', className: { baseVal: '' } }), '<svg>');
    assert.equal(text({ nodeType: 3, nodeName: '#text', data: 'hello' }), '#text');
    assert.equal(text({ target: { nodeType: 9, nodeName: '#document' } }), '{"target":"#document"}');
  });

  test('BigInt, Symbol and functions', () => {
    assert.equal(text(10n), '10n');
    assert.equal(text({ big: 2n ** 70n }), '{"big":"1180591620717411303424n"}');
    assert.equal(text(Symbol('s')), 'Symbol(s)');
    assert.equal(text({ [Symbol('hidden')]: 1, s: Symbol.iterator }), '{"s":"Symbol(Symbol.iterator)"}');
    assert.equal(text(function handler() {}), '[Function handler]');
    assert.equal(text({ cb: () => 1 }), '{"cb":"[Function cb]"}');
  });

  test('long strings are cut and marked', () => {
    const long = 'a'.repeat(20000);
    assert.equal(toText(long, 100), 'a'.repeat(100) + '…');
    assert.equal(text({ s: long }), JSON.stringify({ s: 'a'.repeat(MAX_VALUE) + '…' }));
    assert.equal(cut('short', 5), 'short');
  });

  test('deep, wide and huge values are bounded', () => {
    const deep = { a: { b: { c: { d: { e: { f: 1 } } } } } };
    assert.equal(text(deep), '{"a":{"b":{"c":{"d":"…"}}}}');
    const wide = Object.fromEntries(Array.from({ length: 80 }, (_, i) => [`k${i}`, i]));
    const parsed = JSON.parse(text(wide));
    assert.equal(Object.keys(parsed).length, 51);
    assert.equal(parsed['…'], '+30');
    const huge = new Array(1_000_000).fill(7);
    const list = JSON.parse(text(huge));
    assert.equal(list.length, 51);
    assert.equal(list[50], '+999950');
    assert.equal(JSON.parse(text(new Uint8Array(5_000_000))).length, 51);
    const fan = Array.from({ length: 50 }, () => Array.from({ length: 50 }, () => ({ v: [1, 2] })));
    assert.ok(text(fan).length < 20000, 'at most a few hundred objects are walked');
  });

  test('Dates, Maps and Sets are readable', () => {
    assert.equal(text({ at: new Date(Date.UTC(2026, 0, 2)) }), '{"at":"2026-01-02T00:00:00.000Z"}');
    assert.equal(text(new Map([['k', 1]])), '[["k",1]]');
    assert.equal(text(new Set([1, 2])), '[1,2]');
  });

  test('throwing getters, toJSON and proxies do not escape', () => {
    const getter = { ok: 1, get bad() { throw new Error('no'); } };
    assert.equal(text(getter), '{"ok":1,"bad":"[Throws]"}');
    assert.equal(text({ toJSON() { throw new Error('no'); } }), '[unserializable]');
    const proxy = new Proxy({}, { ownKeys() { throw new Error('trap'); } });
    assert.equal(text(proxy), '[unserializable]');
  });
});

describe('errorInfo', () => {
  test('an Error gives type, message and stack', () => {
    const e = new SyntaxError('unexpected token');
    const info = errorInfo(e, 8192)!;
    assert.equal(info.type, 'SyntaxError');
    assert.equal(info.message, 'unexpected token');
    assert.match(info.stack!, /^SyntaxError: unexpected token\n\s+at /);
  });

  test('error-shaped objects are taken, anything else is not an error', () => {
    assert.deepEqual(errorInfo({ name: 'UnhandledRejection', message: { code: 7 } }, 8192),
      { type: 'UnhandledRejection', message: '{"code":7}', stack: undefined });
    assert.equal(errorInfo('just text', 8192), undefined);
    assert.equal(errorInfo(undefined, 8192), undefined);
  });

  test('messages and stacks are cut', () => {
    const e = new Error('m'.repeat(500));
    const info = errorInfo(e, 100)!;
    assert.equal(info.message.length, 101);
    assert.ok(info.stack!.length <= 201);
  });
});

describe('toAttrs', () => {
  test('scalars are kept, everything else becomes bounded text', () => {
    const attrs = {};
    const err = new Error('e');
    const found = toAttrs({
      s: 'x', n: 1.5, b: false, z: null, u: undefined, big: 5n, nan: NaN,
      obj: { deep: [1] }, err, long: 'l'.repeat(5000), err2: new Error('second'),
    }, attrs);
    assert.deepEqual(attrs, {
      s: 'x', n: 1.5, b: false, z: null, big: '5n', nan: 'NaN', obj: '{"deep":[1]}',
      err: 'Error: e', long: 'l'.repeat(MAX_VALUE) + '…', err2: 'Error: second',
    });
    assert.equal(found, err, 'the first Error is returned for the event error');
  });

  test('at most 64 attributes, added onto the given ones', () => {
    const many = Object.fromEntries(Array.from({ length: 100 }, (_, i) => [`a${i}`, i]));
    const into = {};
    assert.equal(toAttrs(many, into), undefined);
    assert.equal(Object.keys(into).length, 64);
    const onto = { a: 1 };
    toAttrs({ b: 2 }, onto);
    assert.deepEqual(onto, { a: 1, b: 2 });
  });
});
