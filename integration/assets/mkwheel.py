"""Writes a minimal pure-Python wheel (belayer_demo 1.0) to sys.argv[1]: there is no package
index in the sandbox, the episode installs this local wheel."""
import base64, hashlib, sys, zipfile

files = {
    "belayer_demo/__init__.py": b"def answer():\n    return 42\n",
    "belayer_demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: belayer-demo\nVersion: 1.0\n",
    "belayer_demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: belayer\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(data)}")
record.append("belayer_demo-1.0.dist-info/RECORD,,")
files["belayer_demo-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, data in files.items():
        z.writestr(name, data)
