def get_total(prices):
    return sum(prices)


def average(prices):
    return get_total(prices) / len(prices)
