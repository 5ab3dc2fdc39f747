"""Model families: each file one family, its forward and its declaration (family.py), and the registry that names them."""
