"""The task kinds, one package each (classification, regression, multilabel, tokens, choices, spans): everything the
toolkit does differently per kind of task, behind one contract (kinds/base.py) and one table (kinds/registry.py).

No imports here: Python runs a package's __init__ before any of its submodules, and the recipes layer imports a kind's
recipe section (finetune.kinds.K.recipe) without the rest of the kind. Each role-named module of a kind sits in the
layer of its role (tests/project/test_architecture.py's layer_of): recipe in the recipes layer; data, metrics and model
beside data and models; training beside the loop; kind.py, stage.py and evaluation.py in the kinds layer, just below
the stages.
"""
