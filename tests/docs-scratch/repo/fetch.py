import json

# Stands in for a download (the stage may have --net host).
print(json.dumps({"version": 3}))
