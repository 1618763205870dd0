"""Caffe2's `net_drawer` draws nets with pydot/graphviz; rnn2jax does not draw. Importing it works
(Caffe2's gradient checker imports it); drawing raises."""

from __future__ import annotations

from typing import Any

from ...errors import Rnn2JaxError


def _unavailable(*args: Any, **kwargs: Any) -> Any:
    raise Rnn2JaxError("net_drawer: drawing nets is not part of rnn2jax (use `rnn2jax inspect` for a summary)")


GetPydotGraph = GetPydotGraphMinimal = GetOperatorMapForPlan = _unavailable
