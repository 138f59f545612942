print("hello from x.py")
