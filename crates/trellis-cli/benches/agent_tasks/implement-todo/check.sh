# Judges the task in its working directory; $FIXTURE is the task's untouched files.
set -e
python3 -c "from primes import primes_below, is_prime; assert primes_below(30) == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]; assert not is_prime(1) and not is_prime(0) and is_prime(97)"
