<?php
// Shared by front.php and rows.php (bench/frontpage.sh serves them with Apache prefork +
// mod_php and with nginx + PHP-FPM): the database connection, HTML escaping, and sending
// a page. The pages are the appsrv frontpage example's (crates/appsrv/examples/frontpage),
// byte for byte: bench/frontpage.sh compares them with cmp before it loads any server.

declare(strict_types=1);

// The DSN comes from the server: `SetEnv FRONTPAGE_DSN …` (Apache) or `fastcgi_param
// FRONTPAGE_DSN …` (nginx), e.g. sqlite:/tmp/…/frontpage.db or
// pgsql:host=/var/run/postgresql;dbname=frontpage_bench;user=nobody.
function fp_db(): PDO
{
    $dsn = $_SERVER['FRONTPAGE_DSN'] ?? getenv('FRONTPAGE_DSN');
    if (!is_string($dsn) || $dsn === '') {
        fp_plain(500, "FRONTPAGE_DSN is not set\n");
    }
    // A persistent connection: kept by the PHP process (an Apache child, a PHP-FPM
    // worker) from one request to the next, the nearest PHP has to appsrv's per-worker
    // connection. Its prepared statements are not kept: PDO prepares them again on every
    // request (for PostgreSQL, a Parse per statement and request).
    return new PDO($dsn, null, null, [
        PDO::ATTR_PERSISTENT => true,
        PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION,
    ]);
}

// Runs prepared statement $sql with integer parameter $n (or none); all rows, as lists.
function fp_query(PDO $db, string $sql, ?int $n = null): array
{
    $st = $db->prepare($sql);
    if ($n !== null) {
        $st->bindValue(1, $n, PDO::PARAM_INT);
    }
    $st->execute();
    return $st->fetchAll(PDO::FETCH_NUM);
}

// askama's HTML escaping, the example's templates' (numeric references; htmlspecialchars
// writes named ones and `'` as &#039;).
const FP_ESCAPES = [
    '&' => '&#38;',
    '<' => '&#60;',
    '>' => '&#62;',
    '"' => '&#34;',
    "'" => '&#39;',
];

function fp_e($value): string
{
    return strtr((string) $value, FP_ESCAPES);
}

// Sends a page with its length: without Content-Length, nginx answers an HTTP/1.0
// keep-alive request (ab -k) with `Connection: close`, since it cannot chunk for 1.0.
function fp_send(int $status, string $type, string $body): void
{
    http_response_code($status);
    header('Content-Type: ' . $type);
    header('Content-Length: ' . strlen($body));
    echo $body;
}

function fp_plain(int $status, string $text): never
{
    fp_send($status, 'text/plain; charset=utf-8', $text);
    exit;
}

// The example answers 503 when the database cannot be reached; here every database
// error is one (the benchmark expects none).
function fp_failed(PDOException $e): never
{
    error_log('frontpage: ' . $e->getMessage());
    header('Retry-After: 1');
    fp_plain(503, "the database is unavailable; try again\n");
}
