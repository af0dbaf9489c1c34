'use strict';
// The two Node.js lock patterns jobguard is measured against and must
// interoperate with, written the way application code writes them:
//   plain   - the seed article's ioredis pattern: SET key token NX PX ttl, and the
//             compare-and-delete script for release (registered with defineCommand,
//             so it travels as EVALSHA with an automatic EVAL fallback on NOSCRIPT).
//   redlock - node-redlock v5 over a single ioredis client (quorum of one).
// Both store a plain string token under jobguard:lock:{R}, the same key and
// value shape as jobguard, so all three contend on one key.
const crypto = require('node:crypto');
const Redis = require('ioredis');
const RedlockModule = require('redlock');

const Redlock = RedlockModule.default || RedlockModule;
const { ResourceLockedError, ExecutionError } = RedlockModule;

// Byte-for-byte the script jobguard's release uses (minus its PUBLISH).
const RELEASE_LUA =
  "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

function lockKey(resource) {
  if (typeof resource !== 'string' || resource.length === 0) {
    throw new Error(`lock resource must be a non-empty string, got ${JSON.stringify(resource)}`);
  }
  // The braces are a Redis Cluster hash tag: the lock and its companion keys
  // (fence counter, notification channel) hash to one slot.
  return `jobguard:lock:{${resource}}`;
}

// Every network call has a deadline: commandTimeout bounds each command,
// connectTimeout the connect, and maxRetriesPerRequest stops ioredis from
// queueing a command forever while it reconnects.
function connect(url, extra = {}) {
  const client = new Redis(url, {
    connectTimeout: 5000,
    commandTimeout: 5000,
    maxRetriesPerRequest: 1,
    enableOfflineQueue: true,
    lazyConnect: false,
    ...extra,
  });
  // Without a listener ioredis prints every reconnect error; callers see
  // failures through rejected commands instead.
  client.on('error', () => {});
  return client;
}

class PlainLock {
  constructor(client) {
    this.client = client;
    if (typeof client.jobguardRelease !== 'function') {
      client.defineCommand('jobguardRelease', { numberOfKeys: 1, lua: RELEASE_LUA });
    }
  }

  // Returns a handle when acquired, null when the key is held by someone else.
  async tryAcquire(key, ttlMs) {
    const token = crypto.randomUUID();
    const ok = await this.client.set(key, token, 'PX', ttlMs, 'NX');
    return ok === 'OK' ? { key, token } : null;
  }

  // true when the lock was still ours and is now deleted.
  async release(handle) {
    return (await this.client.jobguardRelease(handle.key, handle.token)) === 1;
  }
}

class RedlockLock {
  // settings: node-redlock's own (retryCount, retryDelay, retryJitter, driftFactor).
  constructor(client, settings = {}) {
    this.redlock = new Redlock([client], {
      retryCount: 0,
      automaticExtensionThreshold: 500,
      ...settings,
    });
    // node-redlock emits every per-attempt failure ("resource locked") as an
    // 'error' event; an EventEmitter with no listener would turn that into a throw.
    this.redlock.on('error', () => {});
  }

  // Uses node-redlock's own retry loop (settings.retryCount); null when it gave up.
  async tryAcquire(key, ttlMs, settings) {
    try {
      const lock = await this.redlock.acquire([key], ttlMs, settings);
      return { key, token: lock.value, lock };
    } catch (e) {
      if (e instanceof ExecutionError || e instanceof ResourceLockedError) return null;
      throw e;
    }
  }

  async release(handle) {
    try {
      await handle.lock.release();
      return true;
    } catch (e) {
      if (e instanceof ExecutionError || e instanceof ResourceLockedError) return false;
      throw e;
    }
  }
}

function makeLock(mode, client, settings) {
  if (mode === 'plain') return new PlainLock(client);
  if (mode === 'redlock') return new RedlockLock(client, settings);
  throw new Error(`--mode must be plain or redlock, got ${JSON.stringify(mode)}`);
}

const PEER_NAME = { plain: 'ioredis-plain', redlock: 'node-redlock' };

module.exports = { RELEASE_LUA, lockKey, connect, PlainLock, RedlockLock, makeLock, PEER_NAME };
