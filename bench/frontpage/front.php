<?php
// The front page (GET /): the 20 latest items with their authors, the number of items,
// and a cloud of the 20 most used tags, weighted 1 to 5: the same three queries as the
// appsrv frontpage example (examples/frontpage/db.rs; `?` is the placeholder PDO turns
// into PostgreSQL's `$1`), rendering templates/front.html's bytes.

declare(strict_types=1);
require __DIR__ . '/common.php';

const SQL_LATEST = 'SELECT i.id, i.title, a.name, i.created, i.score FROM items i '
    . 'JOIN authors a ON a.id = i.author_id ORDER BY i.id DESC LIMIT 20';
const SQL_COUNT = 'SELECT COUNT(*) FROM items';
const SQL_CLOUD = 'SELECT t.name, c.n FROM (SELECT tag_id, COUNT(*) AS n FROM item_tags GROUP BY tag_id) c '
    . 'JOIN tags t ON t.id = c.tag_id ORDER BY c.n DESC, t.id LIMIT 20';

try {
    $db = fp_db();
    $latest = fp_query($db, SQL_LATEST);
    $count = fp_query($db, SQL_COUNT)[0][0];
    $cloud = fp_query($db, SQL_CLOUD);
} catch (PDOException $e) {
    fp_failed($e);
}

$max = 1;
foreach ($cloud as $t) {
    $max = max($max, (int) $t[1]);
}

$o = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    . "<title>Front page</title>\n</head>\n<body>\n<h1>Front page</h1>\n"
    . '<p class="count">' . fp_e($count) . " items</p>\n<h2>Latest</h2>\n<ul class=\"latest\">\n";
foreach ($latest as [$id, $title, $author, $created, $score]) {
    $o .= '<li><a href="/item/' . fp_e($id) . '">' . fp_e($title) . '</a> by ' . fp_e($author)
        . ', ' . fp_e($created) . ' (' . fp_e($score) . " points)</li>\n";
}
$o .= "</ul>\n<h2>Tags</h2>\n<p class=\"tags\">\n";
foreach ($cloud as [$name, $n]) {
    $o .= '<span class="w' . (1 + intdiv(4 * (int) $n, $max)) . '">' . fp_e($name)
        . ' (' . fp_e($n) . ")</span>\n";
}
$o .= "</p>\n</body>\n</html>\n";

fp_send(200, 'text/html; charset=utf-8', $o);
