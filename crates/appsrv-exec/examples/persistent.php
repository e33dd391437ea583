#!/usr/bin/env php
<?php
// Persistent mode: a warm PHP process per worker (as PHP-FPM keeps them), answering each
// request with the frame protocol (LEN "\n" BYTES each way; see appsrv-exec's README).
// It counts the requests it served, which shows that it stays up between them.
//
//   appsrv-exec -l 127.0.0.1:7011 --mode persistent --codec lines -- ./persistent.php
//   printf 'hello\nworld\n' | nc -N 127.0.0.1 7011  # hello, hello #1 / hello, world #2
$served = 0;
while (($header = fgets(STDIN)) !== false) {
    $len = (int) $header;
    $request = $len > 0 ? stream_get_contents(STDIN, $len) : "";
    $served++;
    $answer = "hello, $request #$served";
    fwrite(STDOUT, strlen($answer) . "\n" . $answer);
    fflush(STDOUT);
}
