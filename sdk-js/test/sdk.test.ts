/** The public API on a fake page: capture, context, sampling, safety, script-tag options. */

import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, test } from 'node:test';

import { boxId, debugIds, sampled, sessionId } from '../src/context';
import { fromDataset } from '../src/script';
import { type Sdk, createSdk } from '../src/sdk';
import type { Options } from '../src/types';
import { fakePage } from './fakes';

const ENDPOINT = 'http://logs.test:8780/';
let page: ReturnType<typeof fakePage>;

beforeEach(() => {
  page = fakePage();
});
afterEach(() => page.restore());

/** A fresh SDK, started; `random` fixes the session id (and so sampling). */
function start(options: Partial<Options> = {}, random = Math.random): Sdk {
  const sdk = createSdk(random);
  sdk.init({ ingestKey: 'bti_test', endpoint: ENDPOINT, gzip: false, ...options });
  return sdk;
}

describe('capture', () => {
  test('console methods at every level, and the original console still prints', async () => {
    const sdk = start();
    console.debug('d', 1);
    console.log('l', { a: [1] });
    console.info('i');
    console.warn('w');
    console.error('e', new TypeError('bad'));
    assert.deepEqual(page.printed.map(([m]) => m), ['debug', 'log', 'info', 'warn', 'error']);
    assert.equal(await sdk.flush(), true);
    const events = page.events();
    assert.deepEqual(events.map((e) => [e.level, e.message]), [
      ['debug', 'd 1'], ['info', 'l {"a":[1]}'], ['info', 'i'], ['warn', 'w'],
      ['error', 'e TypeError: bad'],
    ]);
    assert.equal(events[4].error.type, 'TypeError');
    assert.match(events[4].error.stack, /TypeError: bad\n\s+at /);
    assert.equal(events[0].url, 'http://b1.box.test:8000/shop');
    assert.equal(page.requests[0].url, 'http://logs.test:8780/v1/ingest?key=bti_test');
    assert.equal(page.requests[0].headers['Content-Type'], 'text/plain');
  });

  test('only the chosen console methods are captured', async () => {
    const sdk = start({ captureConsole: ['warn', 'error'] });
    console.log('not this');
    console.warn('this');
    await sdk.flush();
    assert.deepEqual(page.events().map((e) => e.message), ['this']);
  });

  test('log.* with attributes; an Error attribute becomes the event error', async () => {
    const sdk = start({ captureConsole: false });
    sdk.log.info('checkout', { cart: 3, user: { id: 7 }, none: undefined });
    sdk.log.error('failed', { cause: new RangeError('too far') });
    sdk.log.warn(new Error('as message'));
    await sdk.flush();
    const [info, error, warn] = page.events();
    assert.deepEqual(info.attrs, { cart: 3, user: '{"id":7}' });
    assert.equal(error.error.type, 'RangeError');
    assert.equal(error.attrs.cause, 'RangeError: too far');
    assert.equal(warn.message, 'Error: as message');
    assert.equal(warn.error.message, 'as message');
  });

  test('uncaught errors, thrown non-Errors and unhandled rejections', async () => {
    const sdk = start();
    const boom = new Error('boom');
    page.dispatch('error', { message: 'Uncaught Error: boom', error: boom, filename: 'x.js' });
    page.dispatch('error', { message: 'Uncaught oops', error: 'oops', filename: 'http://b1/app.js',
                             lineno: 3, colno: 9 });
    page.dispatch('error', {}); // a failed <img>: not an error event of ours
    page.dispatch('unhandledrejection', { reason: 'nope' });
    page.dispatch('unhandledrejection', { reason: new TypeError('async bad') });
    await sdk.flush();
    const [thrown, text, rejected, rejectedError] = page.events();
    assert.equal(page.events().length, 4);
    assert.equal(thrown.message, 'Uncaught Error: boom');
    assert.equal(thrown.error.stack, boom.stack);
    assert.deepEqual(thrown.attrs, { mechanism: 'onerror' });
    assert.deepEqual(text.error, { type: 'Error', message: 'oops',
                                   stack: 'Error\n    at http://b1/app.js:3:9' });
    assert.equal(rejected.message, 'Unhandled rejection: nope');
    assert.deepEqual(rejected.error, { type: 'UnhandledRejection', message: 'nope' });
    assert.equal(rejected.attrs.mechanism, 'unhandledrejection');
    assert.equal(rejectedError.error.type, 'TypeError');
  });

  test('pagehide hands the queue to sendBeacon', () => {
    start();
    console.log('last words');
    page.dispatch('pagehide');
    assert.equal(page.beacons.length, 1);
    assert.equal(page.beacons[0].url, 'http://logs.test:8780/v1/ingest?key=bti_test');
    assert.deepEqual(page.beacons[0].body.events.map((e) => e.message), ['last words']);
  });

  test('visibilitychange to hidden does too', () => {
    start();
    console.log('going to background');
    (globalThis as any).document.visibilityState = 'hidden';
    page.dispatch('visibilitychange');
    assert.equal(page.beacons.length, 1);
  });

  test('large bodies are gzipped, once the server has answered a plain one', async () => {
    const sdk = start({ gzip: true, captureConsole: false });
    for (let round = 0; round < 2; round++) {
      for (let i = 0; i < 20; i++) sdk.log.info('line ' + i + ' ' + 'x'.repeat(100));
      await sdk.flush();
    }
    assert.deepEqual(page.requests.map((r) => r.headers['Content-Encoding']), [undefined, 'gzip']);
    assert.equal(page.events().length, 40);
  });
});

describe('network capture', () => {
  test('failed fetch calls are logged; the page still gets its response or its error', async () => {
    const sdk = start({ captureNetwork: true, captureConsole: false });
    const r = await fetch('http://api.test/fail/items', { method: 'post' });
    assert.equal(r.status, 503);
    await assert.rejects(fetch(new Request('http://api.test/down')), TypeError);
    assert.equal((await fetch('http://api.test/ok')).status, 200);
    await sdk.flush();
    assert.deepEqual(page.events().map((e) => [e.message, e.attrs]), [
      ['POST http://api.test/fail/items failed: HTTP 503',
       { mechanism: 'network', method: 'POST', url: 'http://api.test/fail/items', status: 503 }],
      ['GET http://api.test/down failed',
       { mechanism: 'network', method: 'GET', url: 'http://api.test/down', status: 0 }],
    ]);
  });

  test('failed XHRs are logged', async () => {
    const sdk = start({ captureNetwork: true, captureConsole: false });
    for (const url of ['http://api.test/fail', 'http://api.test/down', 'http://api.test/ok']) {
      const x = new XMLHttpRequest();
      x.open('get', url);
      x.send();
    }
    await new Promise((r) => setTimeout(r, 10));
    await sdk.flush();
    assert.deepEqual(page.events().map((e) => e.message).sort(), [
      'GET http://api.test/down failed', 'GET http://api.test/fail failed: HTTP 503',
    ]);
  });

  test('the SDK\'s own failed requests are not logged as page failures', async () => {
    const sdk = start({ captureNetwork: true, captureConsole: false });
    page.answerWith(503);
    sdk.log.info('x');
    assert.equal(await sdk.flush(), false);
    page.answerWith(202);
    assert.equal(await sdk.flush(), true);
    assert.deepEqual(page.events().map((e) => e.message), ['x', 'x']);
  });
});

describe('a page the server refuses', () => {
  test('401: flush() resolves false, the page is told why once, nothing more is sent', async () => {
    const sdk = start();
    page.answerWith(401, JSON.stringify({ error: { code: 'unknown_ingest_key',
      message: "unknown ingest key; pass the project's ingestKey as ?key=", detail: {} } }));
    console.log('x');
    const settled = (p: Promise<boolean>) =>
      Promise.race([p, new Promise((r) => setTimeout(r, 3000, 'pending'))]);
    assert.equal(await settled(sdk.flush()), false);
    console.log('y');
    page.dispatch('pagehide');
    assert.equal(await settled(sdk.flush()), false);
    assert.equal(page.requests.length, 1);
    assert.equal(page.beacons.length, 0);
    const warnings = page.printed.filter(([m]) => m == 'warn').map(([, args]) => args.join(' '));
    assert.deepEqual(warnings, ["boxtrail: HTTP 401 unknown ingest key; pass the project's " +
      'ingestKey as ?key= (this page sends no more logs)']);
  });
});

describe('safety', () => {
  test('a console call inside beforeSend is printed but not captured again', async () => {
    let calls = 0;
    const sdk = start({
      beforeSend: (e) => {
        calls++;
        console.log('inside hook');
        return e;
      },
    });
    console.log('outer');
    await sdk.flush();
    assert.equal(calls, 1);
    assert.deepEqual(page.events().map((e) => e.message), ['outer']);
    assert.deepEqual(page.printed.map(([, args]) => args[0]), ['outer', 'inside hook']);
  });

  test('a value whose toString logs does not recurse', async () => {
    const sdk = start();
    const sneaky = { toJSON() { console.error('from toJSON'); return 'sneaky'; } };
    console.log(sneaky);
    await sdk.flush();
    assert.deepEqual(page.events().map((e) => e.message), ['sneaky']);
  });

  test('nothing the page passes makes the SDK throw', async () => {
    const sdk = start({ beforeSend: () => { throw new Error('hook'); } });
    const hostile = new Proxy({}, { get() { throw new Error('get'); }, ownKeys() { throw new Error('keys'); } });
    assert.doesNotThrow(() => {
      console.log(hostile);
      sdk.log.info(hostile as any, hostile as any);
      sdk.log.error('x', { toString: 1 } as any);
      sdk.setContext(null as any);
      sdk.setContext(hostile as any);
      sdk.init(null as any);
      sdk.init(hostile as any);
    });
    assert.equal(await sdk.flush(), true);
    const report = page.events()[0];
    assert.equal(report.level, 'warn');
    assert.equal(report.attrs.before_send, 3);
  });

  test('before init, and with bad options, the API is inert', async () => {
    const sdk = createSdk();
    sdk.log.info('too early');
    assert.equal(await sdk.flush(), true);
    sdk.init({ endpoint: ENDPOINT } as Options);
    console.log('no key, no capture');
    assert.equal(page.requests.length, 0);
    assert.equal(page.printed.length, 1);
  });

  test('no sessionStorage (sandboxed frame) still works', async () => {
    Object.defineProperty(globalThis, 'sessionStorage', {
      configurable: true, get() { throw new DOMException('denied', 'SecurityError'); },
    });
    const sdk = start();
    console.log('fine');
    await sdk.flush();
    assert.match(page.requests[0].body.context.sessionId, /^[0-9a-f]{16}$/);
  });
});

describe('context', () => {
  test('session, release, user agent, box id from the host, SDK name and version', async () => {
    const sdk = start({ release: '1.4.2' });
    console.log('x');
    await sdk.flush();
    const { context } = page.requests[0].body;
    assert.match(context.sessionId, /^[0-9a-f]{16}$/);
    assert.equal(page.storage.get('boxtrail.sid'), context.sessionId, 'kept for the tab');
    assert.equal(context.release, '1.4.2');
    assert.equal(context.userAgent, 'fake-agent/1.0');
    assert.equal(context.boxId, 'b1');
    assert.equal(context.sdk.name, 'boxtrail');
    assert.match(context.sdk.version, /^\d+\.\d+\.\d+/);
  });

  test('setContext: context fields, and attributes on every later event', async () => {
    const sdk = start({ captureConsole: false });
    sdk.setContext({ release: '2.0', user: 'u1', plan: { tier: 'pro' } });
    sdk.log.info('a', { user: 'override' });
    sdk.setContext({ user: null });
    sdk.log.info('b');
    await sdk.flush();
    const [a, b] = page.events();
    assert.deepEqual(a.attrs, { user: 'override', plan: '{"tier":"pro"}' });
    assert.deepEqual(b.attrs, { plan: '{"tier":"pro"}' });
    assert.equal(page.requests[0].body.context.release, '2.0');
  });

  test('setContext: events keep the context in force when they were captured', async () => {
    const sdk = start({ release: '1.0', captureConsole: false });
    sdk.log.info('before');
    sdk.setContext({ release: '2.0' });
    sdk.log.info('after');
    assert.equal(await sdk.flush(), true);
    sdk.log.info('queued');
    sdk.setContext({ release: '3.0', boxId: 'b9' });
    sdk.log.info('beaconed');
    page.dispatch('pagehide');
    const bodies = page.requests.concat(page.beacons as typeof page.requests).map((r) => r.body);
    assert.deepEqual(bodies.map((b) => [b.context.release, b.context.boxId, b.events.map((e) => e.message)]), [
      ['1.0', 'b1', ['before']], ['2.0', 'b1', ['after']],
      ['2.0', 'b1', ['queued']], ['3.0', 'b9', ['beaconed']],
    ]);
  });

  test('the body carries the debug ids known when it is written', async () => {
    const sdk = start({ captureConsole: false });
    sdk.log.error('before the chunk loaded');
    (globalThis as any)._debugIds = {
      'Error\n    at http://b1.box.test:8000/chunk.js:1:1': 'cccccccc-cccc-4ccc-8ccc-cccccccccccc',
    };
    await sdk.flush();
    assert.deepEqual(page.requests[0].body.context.debugIds,
      { 'http://b1.box.test:8000/chunk.js': 'cccccccc-cccc-4ccc-8ccc-cccccccccccc' });
  });

  test('box id: a valid option wins, an invalid one is ignored', () => {
    assert.equal(boxId(undefined, 'b7.box.parallelsandbox.com'), 'b7');
    assert.equal(boxId('mine', 'b7.box.test'), 'mine');
    assert.equal(boxId('../etc', 'b7.box.test'), 'b7');
    assert.equal(boxId(undefined, 'example.com'), undefined);
  });

  test('debug ids from _sentryDebugIds and _debugIds (V8, Firefox and Safari stacks)', () => {
    const g = globalThis as any;
    g._sentryDebugIds = {
      'Error\n    at https://b1.box.test/assets/app.js:1:120\n    at https://b1.box.test/assets/app.js:1:9':
        'aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa',
      '@https://b1.box.test/assets/vendor.js:2:33\n': 'bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb',
    };
    g._debugIds = {
      'global code@http://b1.box.test:8000/chunk.js:1:1': 'cccccccc-cccc-4ccc-8ccc-cccccccccccc',
      'not a stack': 'dddddddd-dddd-4ddd-8ddd-dddddddddddd',
      'Error\n    at http://x.test/y.js:1:1': 42,
    };
    assert.deepEqual(debugIds(), {
      'https://b1.box.test/assets/app.js': 'aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa',
      'https://b1.box.test/assets/vendor.js': 'bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb',
      'http://b1.box.test:8000/chunk.js': 'cccccccc-cccc-4ccc-8ccc-cccccccccccc',
    });
    g._debugIds['Error\n    at http://b1.box.test/late.js:4:2'] = 'eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee';
    assert.equal(debugIds()!['http://b1.box.test/late.js'], 'eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee',
      'scripts loaded later are picked up');
  });
});

describe('sampling', () => {
  test('decided by the session id, so a session is kept or dropped whole', () => {
    assert.equal(sampled('00000000ffffffff', 0.01), true);
    assert.equal(sampled('7fffffff00000000', 0.5), true);
    assert.equal(sampled('80000000ffffffff', 0.5), false);
    assert.equal(sampled('ffffffff00000000', 0.999), false);
    assert.equal(sampled('ffffffff00000000', 1), true);
    assert.equal(sampled('anything', 0), false);
    assert.equal(sampled('not-hex!', 0.5), true, 'an unreadable id is kept');
  });

  test('a session out of the sample installs nothing and sends nothing', async () => {
    const originalLog = console.log;
    const sdk = start({ sampleRate: 0.5 }, () => 0.75); // id 0xbfffffff...: out
    assert.equal(console.log, originalLog);
    sdk.log.error('not sent');
    assert.equal(await sdk.flush(), true);
    assert.equal(page.requests.length, 0);
  });

  test('a session in the sample sends everything', async () => {
    const sdk = start({ sampleRate: 0.5 }, () => 0.25);
    for (let i = 0; i < 10; i++) sdk.log.info('kept ' + i);
    await sdk.flush();
    assert.equal(page.events().length, 10);
  });

  test('the id is stable for the tab', () => {
    const first = sessionId(() => 0.1);
    assert.equal(sessionId(() => 0.9), first);
  });
});

describe('script tag', () => {
  test('data- attributes become typed options', () => {
    assert.deepEqual(fromDataset({
      ingestKey: 'bti_1', endpoint: 'https://logs.example', release: '1.2', batchSize: '10',
      sampleRate: '0.5', captureConsole: 'warn, error', captureErrors: 'false', captureNetwork: 'true',
    }), {
      ingestKey: 'bti_1', endpoint: 'https://logs.example', release: '1.2', batchSize: 10,
      sampleRate: 0.5, captureConsole: ['warn', 'error'], captureErrors: false, captureNetwork: true,
    });
  });
});
