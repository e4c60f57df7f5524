from util import get_total, average

prices = [3, 4, 5]
print(get_total(prices), average(prices))
