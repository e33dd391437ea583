<?php
// GET /rows?n=N, N from 1 to 1000: a table of the first N items, one <tr> per row, 1
// column up to N = 5, 6 up to 36, 7 beyond: the same queries as the appsrv frontpage
// example (examples/frontpage/db.rs), rendering templates/rows.html's bytes. A missing,
// non-numeric or out-of-range N is 400, as there: the first `n=` of the query, 1 to 4
// digits.

declare(strict_types=1);
require __DIR__ . '/common.php';

const SQL_ROWS_1 = 'SELECT title FROM items ORDER BY id LIMIT CAST(? AS BIGINT)';
const SQL_ROWS_6 = 'SELECT i.id, i.title, a.name, a.email, i.score, i.created FROM items i '
    . 'JOIN authors a ON a.id = i.author_id ORDER BY i.id LIMIT CAST(? AS BIGINT)';
const SQL_ROWS_7 = 'SELECT i.id, i.title, a.name, a.email, i.score, i.created, i.body FROM items i '
    . 'JOIN authors a ON a.id = i.author_id ORDER BY i.id LIMIT CAST(? AS BIGINT)';

$n = null;
foreach (explode('&', $_SERVER['QUERY_STRING'] ?? '') as $pair) {
    if (str_starts_with($pair, 'n=')) {
        $n = substr($pair, 2);
        break;
    }
}
if ($n === null || strlen($n) > 4 || !ctype_digit($n) || (int) $n < 1 || (int) $n > 1000) {
    fp_plain(400, "expected /rows?n=N with N from 1 to 1000\n");
}
$n = (int) $n;

if ($n <= 5) {
    [$sql, $header] = [SQL_ROWS_1, ['title']];
} elseif ($n <= 36) {
    [$sql, $header] = [SQL_ROWS_6, ['id', 'title', 'author', 'email', 'score', 'created']];
} else {
    [$sql, $header] = [SQL_ROWS_7, ['id', 'title', 'author', 'email', 'score', 'created', 'body']];
}

try {
    $rows = fp_query(fp_db(), $sql, $n);
} catch (PDOException $e) {
    fp_failed($e);
}

$o = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    . '<title>' . count($rows) . " rows</title>\n</head>\n<body>\n<table>\n<tr>";
foreach ($header as $h) {
    $o .= '<th>' . fp_e($h) . '</th>';
}
$o .= "</tr>\n";
foreach ($rows as $r) {
    $o .= '<tr>';
    foreach ($r as $c) {
        $o .= '<td>' . fp_e($c) . '</td>';
    }
    $o .= "</tr>\n";
}
$o .= "</table>\n</body>\n</html>\n";

fp_send(200, 'text/html; charset=utf-8', $o);
