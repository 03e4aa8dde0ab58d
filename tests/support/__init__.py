"""Helpers that several test folders share, imported as ``support.<module>``.

``tests/`` is on ``sys.path`` whenever pytest runs any test under it (``tests/conftest.py`` makes
sure of it), so ``from support.paths import DEVSET_DIR`` works from every folder and from any
subset of folders, unlike ``from conftest import ...``, which finds whichever folder's conftest
was imported last.
"""
