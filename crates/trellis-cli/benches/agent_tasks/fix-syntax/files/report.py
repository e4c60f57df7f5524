sales = {"north": 120, "south": 80}

def total(values)
    return sum(values)

print("total:", total(sales.values()))
