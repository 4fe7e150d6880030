__version__ = "0.0.0+source"  # replaced by the build with VERSION's contents
