#!/usr/bin/env php
<?php
// Connection mode: greets the client, then answers each line with its length, until the
// client closes its side.
//
//   appsrv-exec -l 127.0.0.1:7010 -- ./hello.php
//   printf 'hello\n' | nc -N 127.0.0.1 7010      # hello 127.0.0.1 / 5
echo "hello ", getenv("TCPREMOTEIP"), "\n";
while (($line = fgets(STDIN)) !== false) {
    echo strlen(rtrim($line, "\r\n")), "\n";
}
