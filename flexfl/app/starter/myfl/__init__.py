"""Your FlexFL plug-ins: a model (model.py), a dataset (data.py) and a strategy (strategy.py).

The configs beside this folder name them by import path ("myfl.model:TinyNet"); their
`plugin_path = "."` puts the folder that holds `myfl` on sys.path. README.md says what to edit.
"""
