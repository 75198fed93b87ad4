"""Native helpers built at install time (``hatch_build.py``), each with a pure-Python fallback.

``ntcopy.c`` becomes ``libkvstrata_ntcopy.so`` next to it (editable installs) or in the wheel (which is then
tagged for its platform); ``kvstrata.native.ntcopy`` loads it with ctypes. Nothing here is compiled at run time:
a package installed without a C compiler, or a CPU the library does not serve, copies with numpy.
"""
