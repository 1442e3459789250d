"""The compiled core must not use NumPy's C API (that is what lets one wheel serve NumPy 1.x and 2.x)."""
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for n in z.namelist():
        if n.endswith(".so") and b"_ARRAY_API" in z.read(n):
            sys.exit(f"{n} imports NumPy's C API (_ARRAY_API)")
print("no NumPy C API in the compiled modules")
