import pickle, collections
v = {"a": [1, -2, 300, 70000, -(2**40), 2**70], "b": (1.5, None, True, False), "c": b"\x00\xff",
     "d": {"x": "é\n"}, "e": {3}, "f": frozenset([4]), "g": collections.OrderedDict([("k", 1)]), "t": (), "t4": (1,2,3,4)}
shared = [1]
v["s1"] = shared; v["s2"] = shared
for p in (2, 5):
    b = pickle.dumps(v, protocol=p)
    print(f"p{p}", b.hex())
