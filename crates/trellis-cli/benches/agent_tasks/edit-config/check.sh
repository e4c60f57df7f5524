# Judges the task in its working directory; $FIXTURE is the task's untouched files.
set -e
python3 - <<'PY'
import json
c = json.load(open('config.json'))
assert c['port'] == 9090 and c['debug'] is False, c
assert c['name'] == 'orders-api' and c['database'] == {'host': 'localhost', 'pool': 5} and c['features'] == ['search', 'export'], c
PY
