"""The compiled core is what an install gives: fastload.backend is "c"."""
import fastload
assert fastload.backend == "c", fastload.backend
print("fastload", fastload.__version__, "backend", fastload.backend)
