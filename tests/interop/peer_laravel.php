<?php
// A Laravel worker that shares jobguard's locks through Illuminate's own
// Cache::lock (RedisLock over php-redis, Debian php-illuminate-cache and
// php-illuminate-redis), configured the way a Laravel app's config/cache.php
// and config/database.php would be, without the rest of the framework:
// a cache store "jobguard" with prefix "jobguard:lock" on a Redis connection
// whose own key prefix is cleared, so Cache::store('jobguard')->lock('{R}')
// is the Redis key jobguard:lock:{R}. Driven by
// tests/cli/run/interop_peers_test.cpp.
//
//   php peer_laravel.php --host H --port P loop --resource R --id ID --log FILE
//                        [--iterations N] [--hold-ms H] [--ttl-ms T] [--deadline-s D]
//   php peer_laravel.php --host H --port P serve
// The same modes and requests as peer_redis_py.py, except that `extend`,
// `reacquire` and `extend-as` answer "unsupported" (Illuminate's locks have
// no way to extend a held lock), and one more: `force-release R` ->
// force-released (Illuminate's forceRelease(), a plain DEL of whoever's lock). TTLs are whole seconds (SET ... EX), rounded up.
// Exit status: 0 ok; 1 a worker failed; 64 usage; 69 Illuminate or php-redis missing.

declare(strict_types=1);

if (!extension_loaded('redis')) {
    fwrite(STDERR, "peer_laravel: the redis extension is not loaded (Debian: php-redis)\n");
    exit(69);
}
if (!stream_resolve_include_path('Illuminate/Cache/autoload.php') || !stream_resolve_include_path('Illuminate/Redis/autoload.php')) {
    fwrite(STDERR, "peer_laravel: Illuminate cache/redis not on the include path (Debian: php-illuminate-cache php-illuminate-redis)\n");
    exit(69);
}
require_once 'Illuminate/Cache/autoload.php';
require_once 'Illuminate/Redis/autoload.php';

use Illuminate\Cache\CacheManager;
use Illuminate\Contracts\Cache\LockTimeoutException;
use Illuminate\Redis\RedisManager;

// What CacheManager and RedisManager read from the application container:
// the config repository (dotted keys) and the redis manager. No event
// dispatcher is bound, as in a framework without events.
final class MiniApp implements ArrayAccess
{
    private array $items;
    public function __construct(array $items) { $this->items = $items; }
    public function bound($abstract): bool { return isset($this->items[$abstract]); }
    public function offsetExists($key): bool { return isset($this->items[$key]); }
    public function offsetGet($key): mixed { return $this->items[$key]; }
    public function offsetSet($key, $value): void { $this->items[$key] = $value; }
    public function offsetUnset($key): void { unset($this->items[$key]); }
}

function usage(string $why): never
{
    fwrite(STDERR, "peer_laravel: $why\n");
    exit(64);
}

function parse_args(array $argv): array
{
    $opt = ['iterations' => 10, 'hold-ms' => 5, 'ttl-ms' => 5000, 'deadline-s' => 60];
    $mode = null;
    for ($i = 1; $i < count($argv); $i++) {
        $a = $argv[$i];
        if ($a === 'loop' || $a === 'serve') { $mode = $a; continue; }
        if (!str_starts_with($a, '--') || $i + 1 >= count($argv)) usage("unexpected argument '$a'");
        $opt[substr($a, 2)] = $argv[++$i];
    }
    if ($mode === null) usage('give a mode: loop or serve');
    foreach (['host', 'port'] as $k) if (!isset($opt[$k])) usage("--$k is required");
    if ($mode === 'loop') {
        foreach (['resource', 'id', 'log'] as $k) if (!isset($opt[$k])) usage("loop: --$k is required");
        if (preg_match('/\s/', $opt['id'])) usage('--id must not contain whitespace');
        if ((int)$opt['iterations'] < 1) usage('--iterations must be >= 1');
    }
    $opt['mode'] = $mode;
    return $opt;
}

// config/database.php's 'redis' and config/cache.php's stores, as an app
// that shares jobguard's locks would write them.
function cache_manager(array $opt): CacheManager
{
    $redisConfig = [
        'client' => 'phpredis',
        // Laravel's default connection prefix, which would make every key
        // "laravel_database_..."; the locks connection clears it below.
        'options' => ['prefix' => 'laravel_database_'],
        'locks' => [
            'host' => $opt['host'],
            'port' => (int)$opt['port'],
            'database' => 0,
            'timeout' => 5.0,        // connect deadline
            'read_timeout' => 5.0,   // every reply's deadline
            'options' => ['prefix' => ''],
        ],
    ];
    $app = new MiniApp([]);
    $app['redis'] = new RedisManager($app, 'phpredis', $redisConfig);
    $app['config'] = [
        'cache.default' => 'jobguard',
        'cache.prefix' => 'laravel_cache',
        'cache.stores.jobguard' => [
            'driver' => 'redis',
            'connection' => 'locks',
            'lock_connection' => 'locks',
            'prefix' => 'jobguard:lock',   // RedisStore appends ':'
        ],
    ];
    return new CacheManager($app);
}

function lock_name(string $resource): string
{
    return '{' . $resource . '}';
}

// The Redis key Illuminate will use for the lock, from its own objects: the
// connection's phpredis prefix, then the store's prefix, then the name.
function full_key(CacheManager $cache, string $resource): string
{
    $store = $cache->store()->getStore();
    $client = $store->lockConnection()->client();
    return (string)$client->getOption(Redis::OPT_PREFIX) . $store->getPrefix() . lock_name($resource);
}

function raw_client(array $opt): Redis
{
    $r = new Redis();
    if (!$r->connect($opt['host'], (int)$opt['port'], 5.0)) throw new RuntimeException('cannot connect');
    $r->setOption(Redis::OPT_READ_TIMEOUT, 5.0);
    return $r;
}

function append_line(string $path, string $line): void
{
    // One write with O_APPEND: lines of every process stay whole and in order.
    if (file_put_contents($path, $line . "\n", FILE_APPEND) === false) throw new RuntimeException("cannot append to $path");
}

function ttl_seconds(int $ms): int
{
    return max(1, intdiv($ms + 999, 1000));
}

function run_loop(array $opt): int
{
    $cache = cache_manager($opt);
    // A prefix-free client reads the key by jobguard's name for it, so a
    // holder that sees its owner there proves Illuminate wrote that very key.
    $raw = raw_client($opt);
    $key = 'jobguard:lock:{' . $opt['resource'] . '}';
    $deadline = microtime(true) + (float)$opt['deadline-s'];
    for ($i = 1; $i <= (int)$opt['iterations']; $i++) {
        $lock = $cache->lock(lock_name($opt['resource']), ttl_seconds((int)$opt['ttl-ms']));
        // Illuminate polls every 250 ms by default; the test's holders hold
        // for milliseconds.
        $lock->betweenBlockedAttemptsSleepFor(5);
        $left = (int)ceil($deadline - microtime(true));
        try {
            if ($left <= 0) throw new LockTimeoutException();
            $lock->block($left);
        } catch (LockTimeoutException $e) {
            fwrite(STDERR, "peer_laravel: {$opt['id']}: not done after {$opt['deadline-s']} s (iteration $i)\n");
            return 1;
        }
        append_line($opt['log'], "enter {$opt['id']} key=" . full_key($cache, $opt['resource']));
        $stored = $raw->get($key);
        usleep((int)((float)$opt['hold-ms'] * 1000));
        $verdict = $stored === $lock->owner() ? 'ok' : 'mismatch:' . json_encode($stored);
        append_line($opt['log'], "exit {$opt['id']} holder=$verdict");
        if (!$lock->release()) {
            fwrite(STDERR, "peer_laravel: {$opt['id']}: release found the lock no longer ours (iteration $i)\n");
            return 1;
        }
    }
    return 0;
}

function handle(CacheManager $cache, array $w, &$held): string
{
    $cmd = $w[0] ?? '';
    if ($cmd === 'key' && count($w) === 2) return 'key ' . full_key($cache, $w[1]);
    if ($cmd === 'acquire' && count($w) === 4) {
        $lock = $cache->lock(lock_name($w[1]), ttl_seconds((int)$w[2]));
        $lock->betweenBlockedAttemptsSleepFor(5);
        $waitMs = (int)$w[3];
        if ($waitMs > 0) {
            try {
                $lock->block((int)ceil($waitMs / 1000));
            } catch (LockTimeoutException $e) {
                return 'busy';
            }
        } elseif (!$lock->get()) {
            return 'busy';
        }
        $held = $lock;
        return 'ok ' . $lock->owner();
    }
    if ($cmd === 'release' && $held !== null) {
        $ok = $held->release();
        $held = null;
        return $ok ? 'released' : 'not-owned';
    }
    if ($cmd === 'release-as' && count($w) === 3) {
        return $cache->restoreLock(lock_name($w[1]), $w[2])->release() ? 'released' : 'not-owned';
    }
    if ($cmd === 'force-release' && count($w) === 2) {
        $cache->lock(lock_name($w[1]))->forceRelease();
        return 'force-released';
    }
    if (in_array($cmd, ['extend', 'reacquire', 'extend-as'], true)) return 'unsupported';
    return 'error unknown request ' . json_encode(implode(' ', $w));
}

function serve(array $opt): int
{
    $cache = cache_manager($opt);
    $held = null;
    while (($line = fgets(STDIN)) !== false) {
        $w = preg_split('/\s+/', trim($line), -1, PREG_SPLIT_NO_EMPTY);
        try {
            $answer = handle($cache, $w, $held);
        } catch (Throwable $e) {
            $answer = 'error ' . get_class($e) . ': ' . str_replace("\n", ' ', $e->getMessage());
        }
        fwrite(STDOUT, $answer . "\n");
        fflush(STDOUT);
    }
    return 0;
}

$opt = parse_args($argv);
try {
    exit($opt['mode'] === 'loop' ? run_loop($opt) : serve($opt));
} catch (Throwable $e) {
    fwrite(STDERR, 'peer_laravel: ' . get_class($e) . ': ' . $e->getMessage() . "\n");
    exit(1);
}
