#!/bin/sh
# Graphviz's `dot` for the `rnn2jax draw` tests (`make test` runs this first). Installs it with apt-get when it
# is missing and this runs as root; never fails: otherwise it says why the draw-rendering tests will skip.
if command -v dot >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "make: installing Graphviz (dot) for the draw tests"
    if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends graphviz; } \
        >/dev/null 2>&1 && command -v dot >/dev/null 2>&1; then
        exit 0
    fi
    echo "make: apt-get could not install graphviz, so the draw-rendering tests will be skipped"
    exit 0
fi
echo "make: Graphviz's dot is missing (install it: apt-get install graphviz, brew install graphviz), and this" \
    "is not root with apt-get, so the draw-rendering tests will be skipped"
exit 0
