def is_prime(n):
    # TODO: return whether n is a prime number
    raise NotImplementedError


def primes_below(limit):
    return [n for n in range(limit) if is_prime(n)]
