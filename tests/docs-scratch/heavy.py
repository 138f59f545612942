print(sum(i * i for i in range(10**6)))
