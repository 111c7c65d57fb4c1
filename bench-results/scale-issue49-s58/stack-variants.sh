#!/bin/bash
for i in 1 2 3; do
 for v in head authgo nogrow; do
  case $v in head) d=/work/main/bin/bench;; authgo) d=/tmp/expbin;; nogrow) d=/tmp/expbin2;; esac
  /work/main/bin/bench/scale -bin $d -scenarios 10000x100 -servers holds-on -runs 1 -updates 10 -idle 1s -out '' 2>&1 | grep ", holds-on:" | sed "s/^/$v-$i /"
 done
done
echo done
