"""Recipes: typed, validated YAML configs with dotted `key=value` overrides.

A recipe is checked completely before any work starts: unknown keys, wrong types, values out
of range and missing input files are reported as one line that names the key and the file.
Relative paths are read relative to the working directory the command runs in.

One module per stage (pretrain, its model sections in language_models, finetune, evaluation, ulmfit) on top of the
shared sections (base); loader reads a file with its overrides into one of them, describe explains their keys. The
names below are the public ones.
"""

from finetune.recipes.base import (
    DiscriminativeConfig,
    RunRecipe,
    ScheduleConfig,
    Section,
    TrainingConfig,
    TrainingRunRecipe,
)
from finetune.recipes.describe import describe_keys, type_label
from finetune.recipes.evaluation import EvalRecipe, GlueTaskEntry
from finetune.recipes.finetune import BackboneConfig, FinetuneRecipe, UnfreezingConfig
from finetune.recipes.intermediate import INTERMEDIATE_STAGE_FOLDERS, IntermediateRecipe
from finetune.recipes.language_models import AWDLSTMModelConfig, CausalLMModelConfig, MaskedLMModelConfig
from finetune.recipes.loader import (
    RECIPE_TYPES,
    Recipe,
    apply_override,
    input_path_problems,
    load_recipe,
    path_problems,
    read_yaml,
    recipe_from_data,
    recipe_to_yaml,
    run_dir_location_problem,
)
from finetune.recipes.pretrain import CorpusConfig, MaskingConfig, PretrainRecipe, TokenizerConfig
from finetune.recipes.task import TASK_KINDS, TASK_SECTIONS, TaskConfig, task_config
from finetune.recipes.ulmfit import ULMFIT_STAGE_FOLDERS, PretrainedLanguageModel, UlmfitRecipe

__all__ = [
    "INTERMEDIATE_STAGE_FOLDERS",
    "RECIPE_TYPES",
    "TASK_KINDS",
    "TASK_SECTIONS",
    "ULMFIT_STAGE_FOLDERS",
    "AWDLSTMModelConfig",
    "BackboneConfig",
    "CausalLMModelConfig",
    "CorpusConfig",
    "DiscriminativeConfig",
    "EvalRecipe",
    "FinetuneRecipe",
    "GlueTaskEntry",
    "IntermediateRecipe",
    "MaskedLMModelConfig",
    "MaskingConfig",
    "PretrainRecipe",
    "PretrainedLanguageModel",
    "Recipe",
    "RunRecipe",
    "ScheduleConfig",
    "Section",
    "TaskConfig",
    "TokenizerConfig",
    "TrainingConfig",
    "TrainingRunRecipe",
    "UlmfitRecipe",
    "UnfreezingConfig",
    "apply_override",
    "describe_keys",
    "input_path_problems",
    "load_recipe",
    "path_problems",
    "read_yaml",
    "recipe_from_data",
    "recipe_to_yaml",
    "run_dir_location_problem",
    "task_config",
    "type_label",
]
