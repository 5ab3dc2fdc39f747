"""Model families: each file the math of one family (or its declared variations), and the registry that names them."""
