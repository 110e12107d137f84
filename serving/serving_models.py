"""OpenAIServingModels: the names the server answers to, `/v1/models` and `/v1/models/{name}`."""

import os
import time

from serving.protocol import ModelCard, ModelList


class OpenAIServingModels:
    """`served_model_names[0]` is the name responses carry; requests may use any of them."""

    def __init__(self, served_model_names: list[str], model_path: str, max_model_len: int):
        if not served_model_names:
            raise ValueError("served_model_names must hold at least one name, got [].")
        self.served_model_names = list(served_model_names)
        self.model_path = model_path
        self.max_model_len = max_model_len
        self.created = int(time.time())

    @classmethod
    def default_names(cls, model_arg: str | None, model_path: str) -> list[str]:
        """vLLM's default: the `--model` argument as given; the embedded model's directory name
        when no model was given."""
        return [model_arg if model_arg is not None else os.path.basename(os.path.normpath(model_path))]

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def is_served(self, name: str) -> bool:
        return name in self.served_model_names

    def model_card(self, name: str) -> ModelCard | None:
        """`GET /v1/models/{name}`'s card; None for a name not served."""
        if not self.is_served(name):
            return None
        return ModelCard(id=name, created=self.created, root=self.model_path, max_model_len=self.max_model_len)

    def list_models(self) -> ModelList:
        return ModelList(data=[self.model_card(name) for name in self.served_model_names])
