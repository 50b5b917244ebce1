"""finetune: transfer learning for NLP in the line of ULMFiT, GPT and BERT."""

__version__ = "0.1.0"
