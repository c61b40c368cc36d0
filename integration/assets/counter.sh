#!/bin/sh
# Appends 1, 2, 3, … to /work/counter, one number a line, the next number held only in memory:
# after a restore the file must read exactly 1..N, or memory and filesystem disagree.
i=0
while true; do
  i=$((i+1))
  echo "$i" >> /work/counter
  sleep 0.01
done
