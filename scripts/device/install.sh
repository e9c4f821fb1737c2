#!/usr/bin/env bash
# last wheel part: join the stash, install into $HOME/site (../shared/device/README.md)
set -e
cat $HOME/stash/part.* | tar -C $HOME/stash -xf -
python3 -m pip install -q --no-index --no-deps --no-compile --target $HOME/site $HOME/stash/*.whl 2>&1 | grep -v "^$" | tail -3
echo installed: $(ls $HOME/site | wc -l) entries
