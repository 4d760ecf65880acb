"""L0: the library version (a leaf module: importing it loads nothing else)."""
__version__ = '0.1.0'
