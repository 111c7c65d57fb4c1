#!/bin/bash
# new fleet (scale) with old and new servers, alternating; and old fleet with both
out=/tmp/s57/cross.txt
for i in 1 2 3; do
  for combo in newfleet-oldsrv newfleet-newsrv oldfleet-newsrv oldfleet-oldsrv; do
    case $combo in
      newfleet-*) sc=/work/main/bin/bench/scale;; *) sc=/tmp/old/bin/bench/scale;; esac
    case $combo in
      *-oldsrv) b=/tmp/s57/oldsrv;; *) b=/tmp/s57/newsrv;; esac
    $sc -bin $b -scenarios 10000x100 -servers holds-on -runs 1 -updates 20 -idle 1s -out '' 2>&1 | grep -A1 "^  zones" | tail -1 | sed "s/^/$combo-$i /" >> $out
  done
done
echo done >> $out
