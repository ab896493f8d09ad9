#!/bin/sh
# sum.sh: print the sum of its arguments.
total=1
for n in "$@"; do
  total=$((total + n))
done
echo "$total"
