/** The delivery pipeline with fake timers and a fake transport. */

import assert from 'node:assert/strict';
import { describe, test, type TestContext } from 'node:test';

import { MAX_EVENTS, MAX_QUEUED, SMALL_BODY, type Settings, backoff, createClient, retryAfter }
  from '../src/client';
import { cut } from '../src/serialize';
import type { Level, LogEvent } from '../src/types';
import { type Answer, fakeTransport, settle } from './fakes';

const START = Date.UTC(2026, 0, 1);
const CONTEXT = { sessionId: 's1', sdk: { name: 'boxtrail', version: 'test' } };
const BASE: Settings = {
  batchSize: 50, batchBytes: 16384, flushInterval: 1000, maxQueue: 2000, maxEventsPerMinute: 3000,
};

function setup(context: TestContext, settings: Partial<Settings> = {}, answers: Answer[] = [],
               random = () => 0.5) {
  context.mock.timers.enable({ apis: ['setTimeout', 'Date'], now: START });
  const fake = fakeTransport(answers);
  const client = createClient({ ...BASE, ...settings }, fake.transport, () => CONTEXT, random);
  let n = 0;
  const add = (count = 1, level: Level = 'info', message?: string) => {
    for (let i = 0; i < count; i++) {
      client.add_({ ts: Date.now(), level, message: message ?? `m${n++}` });
    }
  };
  /** Advance fake time, letting each send's promise chain run (and what a failed fetch
   * leaves to the next task). */
  const tick = async (ms: number) => {
    context.mock.timers.tick(ms);
    await settle();
    context.mock.timers.tick(0);
    await settle();
  };
  return { client, fake, add, tick };
}

describe('batching thresholds', () => {
  test('a batch leaves at batchSize events, not before', async (c) => {
    const { fake, add, tick } = setup(c, { batchSize: 5 });
    add(4);
    await tick(0);
    assert.equal(fake.posts.length, 0);
    add(1);
    await tick(0);
    assert.equal(fake.posts.length, 1);
    assert.deepEqual(fake.messages(), ['m0', 'm1', 'm2', 'm3', 'm4']);
    assert.deepEqual(fake.posts[0].body.context, CONTEXT);
  });

  test('a batch leaves at batchBytes characters of JSON', async (c) => {
    const { fake, add, tick } = setup(c, { batchBytes: 500 });
    add(3, 'info', 'x'.repeat(100));
    await tick(0);
    assert.equal(fake.posts.length, 0);
    add(2, 'info', 'x'.repeat(100));
    await tick(0);
    assert.equal(fake.posts.length, 1);
    assert.equal(fake.posts[0].body.events.length, 5);
  });

  test('a lone event leaves after flushInterval', async (c) => {
    const { fake, add, tick } = setup(c);
    add(1);
    await tick(999);
    assert.equal(fake.posts.length, 0);
    await tick(1);
    assert.equal(fake.posts.length, 1);
    assert.equal(fake.posts[0].at, START + 1000);
  });

  test('one request in flight; a backlog goes in requests of at most MAX_EVENTS', async (c) => {
    let release!: (v: [number, null]) => void;
    const held = new Promise<[number, null]>((r) => { release = r; });
    const { fake, add, tick } = setup(c, {}, [held]);
    add(50);
    await tick(0);
    add(1150);
    await tick(5000);
    assert.equal(fake.posts.length, 1, 'nothing else is sent while a request is in flight');
    release([202, null]);
    for (let i = 0; i < 4; i++) await tick(0);
    assert.deepEqual(fake.posts.map((p) => p.body.events.length), [50, MAX_EVENTS, MAX_EVENTS, 150]);
    assert.deepEqual(fake.messages(), Array.from({ length: 1200 }, (_, i) => `m${i}`));
  });

  test('flush() sends at once and resolves true when all is delivered', async (c) => {
    const { client, fake, add, tick } = setup(c);
    add(3);
    const done = client.flush_();
    await tick(0);
    assert.equal(await done, true);
    assert.equal(fake.posts.length, 1);
    assert.equal(await client.flush_(), true, 'nothing queued: resolves at once');
  });
});

describe('retries', () => {
  test('backoff doubles from 0.5 s to a 30 s cap, with ±25% jitter', () => {
    const half = () => 0.5;
    assert.deepEqual([0, 1, 2, 3, 4, 5, 6, 7, 10].map((a) => backoff(a, half)),
      [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
    assert.equal(backoff(0, () => 0), 375);
    assert.equal(backoff(0, () => 1), 625);
  });

  test('network errors are retried on the backoff schedule, then delivered', async (c) => {
    const failures: Answer[] = Array(7).fill('network');
    const { fake, add, tick } = setup(c, {}, failures);
    add(1);
    await tick(1000);
    for (const wait of [500, 1000, 2000, 4000, 8000, 16000, 30000]) {
      const before = fake.posts.length;
      await tick(wait - 1);
      assert.equal(fake.posts.length, before, `not before ${wait} ms`);
      await tick(1);
      assert.equal(fake.posts.length, before + 1, `after ${wait} ms`);
    }
    assert.equal(fake.posts.length, 8);
    assert.deepEqual(new Set(fake.messages()), new Set(['m0']));
    // Delivered: the attempt counter starts again from 0.5 s.
    fake.answers.push('network');
    add(1);
    await tick(1000);
    await tick(500);
    assert.equal(fake.posts.at(-1)!.body.events[0].message, 'm1');
    assert.equal(fake.posts.at(-1)!.at - fake.posts.at(-2)!.at, 500);
  });

  test('429 and 503 wait for Retry-After (seconds or an HTTP date)', async (c) => {
    const date = new Date(START + 1000 + 7000).toUTCString();
    const { fake, add, tick } = setup(c, {}, [[429, '3'], [503, date], 500, 202]);
    add(1);
    await tick(1000);
    await tick(2999);
    assert.equal(fake.posts.length, 1);
    await tick(1);
    assert.equal(fake.posts.length, 2, 'Retry-After: 3');
    await tick(3999);
    assert.equal(fake.posts.length, 2);
    await tick(1);
    assert.equal(fake.posts.length, 3, 'Retry-After as an HTTP date');
    // A 500 without Retry-After falls back to the backoff (third failure: 2 s).
    await tick(2000);
    assert.equal(fake.posts.length, 4);
  });

  test('Retry-After parsing', () => {
    assert.equal(retryAfter(null, START), undefined);
    assert.equal(retryAfter('0', START), 0);
    assert.equal(retryAfter('12', START), 12000);
    assert.equal(retryAfter('86400', START), 600000, 'capped at 10 minutes');
    assert.equal(retryAfter(new Date(START + 5000).toUTCString(), START), 5000);
    assert.equal(retryAfter('soon', START), undefined);
  });

  test('408 and 5xx are retried; other 4xx are dropped and reported as rejected', async (c) => {
    const { fake, add, tick } = setup(c, {}, [408, 502, 400]);
    add(2);
    await tick(1000);
    await tick(500);
    await tick(1000);
    assert.equal(fake.posts.length, 3);
    add(1);
    await tick(1000);
    assert.equal(fake.posts.length, 4);
    const [report, next] = fake.posts[3].body.events;
    assert.equal(report.level, 'warn');
    assert.match(report.message, /^boxtrail: dropped 2 events/);
    assert.deepEqual(report.attrs, { dropped: 2, rejected: 2 });
    assert.equal(next.message, 'm2');
  });
});

describe('refusals', () => {
  test('flush() resolves false when its batch is refused', async (c) => {
    const { client, add, tick } = setup(c, {}, [400]);
    add(1);
    let result: boolean | undefined;
    void client.flush_().then((ok) => { result = ok; });
    await tick(0);
    assert.equal(result, false);
  });

  test('a body holding only the drop report, refused, is not sent again', async (c) => {
    const { fake, add, tick } = setup(c, {}, [400, 400]);
    add(2);
    await tick(1000); // refused: 2 events dropped as rejected
    await tick(1000); // the report alone, refused too
    assert.deepEqual(fake.posts[1].body.events.map((e) => e.attrs), [{ dropped: 2, rejected: 2 }]);
    await tick(60000);
    assert.equal(fake.posts.length, 2);
  });

  const refusals: Array<[number, string, RegExp]> = [
    [401, '{"error":{"code":"unknown_ingest_key","message":"unknown ingest key"}}',
     /^boxtrail: HTTP 401 unknown ingest key \(this page sends no more logs\)$/],
    [403, 'Forbidden by a proxy', /^boxtrail: HTTP 403 Forbidden by a proxy \(this page sends no more logs\)$/],
  ];
  for (const [status, text, said] of refusals) {
    test(`after a ${status} the page sends nothing more, flush() resolves false, one warning`, async (c) => {
      const warn = c.mock.method(console, 'warn', () => {});
      const { client, fake, add, tick } = setup(c, { maxQueue: 3 }, [[status, null, text]]);
      add(5); // 2 dropped: a report rides along
      let first: boolean | undefined;
      void client.flush_().then((ok) => { first = ok; });
      await tick(0);
      assert.equal(first, false, 'resolved at the refusal');
      add(60);
      let later: boolean | undefined;
      void client.flush_().then((ok) => { later = ok; });
      await tick(0);
      assert.equal(later, false, 'resolved at once');
      client.hide_();
      for (let i = 0; i < 120; i++) await tick(1000);
      assert.equal(fake.posts.length, 1, 'no request after the refusal');
      assert.equal(fake.beacons.length, 0, 'no beacon either');
      assert.equal(warn.mock.callCount(), 1);
      assert.match(String(warn.mock.calls[0].arguments[0]), said);
    });
  }
});

describe('queue cap and drop counting', () => {
  test('the oldest are dropped first and the count arrives with the next batch', async (c) => {
    const { fake, add, tick } = setup(c, { maxQueue: 10, batchSize: 100 }, ['network']);
    add(25);
    await tick(1000);
    assert.equal(fake.posts.length, 1);
    await tick(500); // the retry carries the same report and events
    const events = fake.posts[1].body.events;
    assert.deepEqual(events[0].attrs, { dropped: 15, queue_full: 15 });
    assert.equal(events[0].message, 'boxtrail: dropped 15 events {"queue_full":15}');
    assert.equal(typeof events[0].ts, 'number');
    assert.deepEqual(events.slice(1).map((e) => e.message),
      Array.from({ length: 10 }, (_, i) => `m${i + 15}`));
  });

  test('events that arrive while a batch is in flight push the oldest queued out', async (c) => {
    let fail!: (e: Error) => void;
    const held = new Promise<[number, null]>((_, reject) => { fail = reject; });
    const { fake, add, tick } = setup(c, { maxQueue: 8, batchSize: 4 }, [held]);
    add(4);
    await tick(0);
    add(6); // 4 in flight + 6 queued > 8: m4, m5 go
    fail(new TypeError('Failed to fetch'));
    await tick(0);
    await tick(500);
    const events = fake.posts[1].body.events;
    assert.deepEqual(events[0].attrs, { dropped: 2, queue_full: 2 });
    assert.deepEqual(events.slice(1).map((e) => e.message), ['m0', 'm1', 'm2', 'm3', 'm6', 'm7', 'm8', 'm9']);
  });

  test('a report in a failed batch is sent again, not lost nor counted twice', async (c) => {
    const { fake, add, tick } = setup(c, { maxQueue: 2, batchSize: 100 }, ['network', 'network']);
    add(5);
    await tick(1000); // fails: m3, m4 back in the queue
    await tick(500); // report (3) + m3, m4: fails again
    add(1); // m5 pushes m3 out
    await tick(1000);
    const last = fake.posts.at(-1)!.body.events;
    assert.deepEqual(last[0].attrs, { dropped: 4, queue_full: 4 });
    assert.deepEqual(last.slice(1).map((e) => e.message), ['m4', 'm5']);
    await tick(60000);
    assert.equal(fake.posts.length, 3, 'nothing more to send');
  });

  test('the queue is bounded in characters too', async (c) => {
    const { client, fake, add, tick } = setup(c, {}, ['network']);
    add(1);
    await tick(1000); // fails: from now on everything waits in the queue
    for (let i = 1; i <= 300; i++) { // 6 M characters of JSON
      client.add_({ ts: Date.now(), level: 'info', message: `m${i} ` + 'w'.repeat(20000) });
    }
    for (let i = 0; i < 200; i++) await tick(1000);
    const events = fake.posts.slice(1).flatMap((p) => p.body.events);
    const report = events.find((e) => e.message.startsWith('boxtrail: dropped'))!;
    const delivered = events.filter((e) => e !== report);
    assert.ok(delivered.length * 20000 <= MAX_QUEUED, `${delivered.length} big events kept`);
    assert.equal(delivered.length + report.attrs.queue_full, 301, 'every event accounted for');
    assert.equal(delivered.at(-1)!.message.split(' ')[0], 'm300', 'the newest are kept');
  });

  test('a hard cap per minute, counted apart for errors', async (c) => {
    const { fake, add, tick } = setup(c, { maxEventsPerMinute: 5, batchSize: 100 });
    add(8);
    add(2, 'error');
    await tick(1000);
    const [report, ...events] = fake.posts[0].body.events;
    assert.deepEqual(report.attrs, { dropped: 3, rate_limit: 3 });
    assert.deepEqual(events.map((e) => e.message), ['m0', 'm1', 'm2', 'm3', 'm4', 'm8', 'm9']);
    await tick(59000);
    add(1);
    await tick(1000);
    assert.deepEqual(fake.posts[1].body.events.map((e) => e.message), ['m10'],
      'a new minute, a new allowance');
  });
});

describe('beforeSend', () => {
  test('can change an event, or drop it without it counting as a loss', async (c) => {
    const { fake, add, tick } = setup(c, {
      beforeSend: (e: LogEvent) => (e.message == 'm1' ? null : { ...e, message: e.message.toUpperCase() }),
    });
    add(3);
    await tick(1000);
    assert.deepEqual(fake.messages(), ['M0', 'M2']);
  });

  test('a throwing beforeSend drops the event and the drop is reported', async (c) => {
    const { fake, add, tick } = setup(c, {
      beforeSend: (e: LogEvent) => {
        if (e.message == 'm0') throw new Error('bug in hook');
        return e;
      },
    });
    add(2);
    await tick(1000);
    assert.deepEqual(fake.posts[0].body.events[0].attrs, { dropped: 1, before_send: 1 });
    assert.equal(fake.posts[0].body.events[1].message, 'm1');
  });

  test('an event made unserializable by beforeSend is dropped, not thrown', async (c) => {
    const { client, fake, tick } = setup(c, {
      beforeSend: (e: LogEvent) => ({ ...e, attrs: { n: 1n as unknown as number } }),
    });
    assert.doesNotThrow(() => client.add_({ ts: Date.now(), level: 'info', message: 'x' }));
    await tick(1000);
    assert.deepEqual(fake.posts[0].body.events[0].attrs, { dropped: 1, before_send: 1 });
  });
});

describe('serialization', () => {
  test('lone surrogates become U+FFFD; pairs are left alone; the body stays valid', async (c) => {
    const { client, fake, tick } = setup(c);
    for (const message of ['cut \ud83d', '\udc00 alone', 'pair 😀', 'both \\\ud83d', 'text \\ud83d']) {
      client.add_({ ts: Date.now(), level: 'info', message });
    }
    client.add_({ ts: Date.now(), level: 'info', message: cut('x😀', 2) });
    await tick(1000);
    assert.deepEqual(fake.messages(),
      ['cut \ufffd', '\ufffd alone', 'pair 😀', 'both \\\ufffd', 'text \\ufffd', 'x\ufffd…']);
  });
});

describe('page hide', () => {
  test('the queue goes out by beacon, in bodies below the beacon size', async (c) => {
    const { client, fake, add } = setup(c, { batchSize: 10000, batchBytes: 1e9 });
    add(400, 'info', 'y'.repeat(200));
    client.hide_();
    assert.equal(fake.posts.length, 0);
    assert.ok(fake.beacons.length >= 3);
    assert.equal(fake.beacons.flatMap((b) => b.events).length, 400);
    for (const b of fake.beacons) assert.ok(JSON.stringify(b).length <= SMALL_BODY + 1000);
    assert.deepEqual(fake.beacons[0].context, CONTEXT);
  });

  test('what the browser refuses to beacon stays queued and is sent later', async (c) => {
    const { client, fake, add, tick } = setup(c);
    add(3);
    fake.refuseBeacons(true);
    client.hide_();
    assert.equal(fake.beacons.length, 0);
    await tick(1000);
    assert.deepEqual(fake.messages(), ['m0', 'm1', 'm2']);
  });

  test('a batch still being compressed goes by beacon, and is not posted after', async (c) => {
    c.mock.timers.enable({ apis: ['setTimeout', 'Date'], now: START });
    const fake = fakeTransport();
    let finish!: (b: Blob) => void;
    fake.transport.gzip_ = () => new Promise((r) => { finish = r; });
    const client = createClient(BASE, fake.transport, () => CONTEXT);
    client.add_({ ts: Date.now(), level: 'info', message: 'first' }); // plain, answered
    c.mock.timers.tick(1000);
    await settle();
    client.add_({ ts: Date.now(), level: 'info', message: 'z'.repeat(2000) });
    c.mock.timers.tick(1000);
    await settle();
    client.hide_();
    assert.equal(fake.beacons.length, 1);
    assert.equal(fake.beacons[0].events[0].message.length, 2000);
    finish(new Blob(['ignored']));
    await settle();
    c.mock.timers.tick(60000);
    await settle();
    assert.equal(fake.posts.length, 1);
  });

  test('a batch in flight when the page hides is not sent again when its fetch then fails', async (c) => {
    // Chromium lets a keepalive request outlive the page but rejects its promise as the page
    // goes: the request is still on its way, so the beacon must not carry its events again.
    let fail!: (e: Error) => void;
    const held = new Promise<[number, null]>((_, reject) => { fail = reject; });
    const { client, fake, add, tick } = setup(c, { batchSize: 3 }, [held]);
    add(3);
    await tick(0);
    add(2);
    client.hide_(); // pagehide
    fail(new TypeError('Failed to fetch'));
    await tick(0);
    client.hide_(); // visibilitychange to hidden
    const beaconed = fake.beacons.flatMap((b) => b.events.map((e) => e.message));
    assert.deepEqual(beaconed, ['m3', 'm4']);
    await tick(60000);
    assert.equal(fake.posts.length, 1);
    assert.deepEqual(fake.messages(), ['m0', 'm1', 'm2']);
  });

  test('nor when Chromium rejects its fetch just before the pagehide listeners run', async (c) => {
    let fail!: (e: Error) => void;
    const held = new Promise<[number, null]>((_, reject) => { fail = reject; });
    const { client, fake, add, tick } = setup(c, { batchSize: 3 }, [held]);
    add(3);
    await tick(0);
    add(2);
    // One task: the fetch is rejected, a listener of the page registered before the SDK's
    // runs (and the microtasks after it), then the SDK's pagehide and visibilitychange.
    fail(new TypeError('Failed to fetch'));
    await settle();
    client.hide_();
    client.hide_();
    await tick(0); // the page is gone by now; were it not, nothing more would be sent either
    const beaconed = fake.beacons.flatMap((b) => b.events.map((e) => e.message));
    assert.deepEqual(beaconed, ['m3', 'm4']);
    await tick(60000);
    assert.equal(fake.posts.length, 1);
  });

  test('a batch in flight when the page hides that the server refuses (503) is sent again', async (c) => {
    let answer!: (a: [number, null]) => void;
    const held = new Promise<[number, null]>((r) => { answer = r; });
    const { client, fake, add, tick } = setup(c, { batchSize: 2 }, [held]);
    add(2);
    await tick(0);
    client.hide_(); // a tab in the background: the page stays
    answer([503, null]);
    await tick(0);
    await tick(500);
    assert.deepEqual(fake.messages(), ['m0', 'm1', 'm0', 'm1']);
    assert.equal(fake.beacons.length, 0);
  });

  test('drop counts go with the beacon', async (c) => {
    const { client, fake, add } = setup(c, { maxQueue: 1 });
    add(3);
    client.hide_();
    assert.deepEqual(fake.beacons[0].events[0].attrs, { dropped: 2, queue_full: 2 });
    assert.equal(fake.beacons[0].events[1].message, 'm2');
  });
});

describe('compression', () => {
  test('the first body goes plain; gzip once answered, but not on the retry after a network error',
    async (c) => {
      // A gzipped body needs a CORS preflight, and a refused preflight (unknown key, origin not
      // allowed) looks like a network error: a plain body gets the refusal's status and text.
      const { fake, add, tick } = setup(c, { batchSize: 20 }, [202, 'network', 202]);
      fake.transport.gzip_ = async () => new Blob(['gz']);
      for (let round = 0; round < 3; round++) {
        add(20, 'info', 'x'.repeat(100));
        await tick(0);
        await tick(0);
        await tick(500);
      }
      assert.deepEqual(fake.posts.map((p) => p.gzipped), [false, true, false, true]);
    });
});

describe('context', () => {
  test('each event keeps the context it was added under; a body holds one context', async (c) => {
    c.mock.timers.enable({ apis: ['setTimeout', 'Date'], now: START });
    const fake = fakeTransport();
    let context = { release: '1' };
    const client = createClient(BASE, fake.transport, () => context);
    const add = (message: string) => client.add_({ ts: Date.now(), level: 'info', message });
    add('a');
    add('b');
    context = { release: '2' };
    add('c');
    context = { release: '1' };
    add('d');
    for (let i = 0; i < 3; i++) {
      c.mock.timers.tick(1000);
      await settle();
    }
    assert.deepEqual(fake.posts.map((p) => [p.body.context.release, p.body.events.map((e) => e.message)]),
      [['1', ['a', 'b']], ['2', ['c']], ['1', ['d']]]);
    context = { release: '3' };
    add('e');
    add('f');
    context = { release: '4' };
    add('g');
    client.hide_();
    assert.deepEqual(fake.beacons.map((b) => [b.context.release, b.events.map((e) => e.message)]),
      [['3', ['e', 'f']], ['4', ['g']]]);
  });
});
