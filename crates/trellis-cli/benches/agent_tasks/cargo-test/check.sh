# Judges the task in its working directory; $FIXTURE is the task's untouched files.
set -e
sed -n '/#\[cfg(test)\]/,$p' src/lib.rs | cmp - <(sed -n '/#\[cfg(test)\]/,$p' "$FIXTURE/src/lib.rs") && cargo test --offline -q
