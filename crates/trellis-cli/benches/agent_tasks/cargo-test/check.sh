# Judges the task in its working directory; $FIXTURE is the task's untouched files.
# The tests (from `#[cfg(test)]` on) must read as they did, blank lines and trailing spaces aside.
set -e
diff -q -B -Z <(sed -n '/#\[cfg(test)\]/,$p' src/lib.rs) <(sed -n '/#\[cfg(test)\]/,$p' "$FIXTURE/src/lib.rs") >/dev/null && cargo test --offline -q
