"""What runs inside a probe process: the space's data, model shape and backend, loaded once.

:class:`ProbeHost` turns a request (probe section, policy, trial number) into
a :class:`~precsearch.probe.result.ProbeResult`. It also applies the fault
injections the fault tests ask for through ``PRECSEARCH_FAULTS``
(``"3:raise,4:oom,5:nan,6:kill,7:segv"``: trial number -> fault), so that
those tests exercise the real process boundary. The variable is for tests;
nothing sets it otherwise.
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager

import torch

from precsearch.backends import get_backend, resolve_device
from precsearch.config.space import ProbeSection, Space
from precsearch.policy import Policy
from precsearch.probe import runner
from precsearch.probe.continuation import Leg
from precsearch.probe.damage import DamageReader
from precsearch.probe.damage.standard import standard_policy
from precsearch.probe.data import load_batches
from precsearch.probe.model.reuse import ModelCache
from precsearch.probe.result import ProbeResult
from precsearch.readings import get_reading
from precsearch.utils import trace
from precsearch.utils.cpu_threads import choose_threads

FAULTS_ENV = "PRECSEARCH_FAULTS"
FAULT_KINDS = ("raise", "oom", "nan", "kill", "segv")


class ProbeHost:
    """A space's probe set-up: device, backend, data and probe model shape."""

    def __init__(self, space: Space):
        self.space = space
        self.device = resolve_device(space.probe.device)
        # the cores other jobs leave free now, not every core (utils/cpu_threads.py); this run is the study
        # process's tree: its probe process (this one) and MLflow server are not other jobs
        if self.device.type == "cpu" and (threads := choose_threads(root=os.getppid())) is not None:
            torch.set_num_threads(threads)
        self.backend = get_backend(space.backend.value, self.device, needs=space.search.precisions())
        self.data = load_batches(space)
        self.cfg = space.model.probe()
        self.start = space.model.start()
        self._damage: DamageReader | None = None
        self.models = ModelCache()  # the last probe's model, initialised again for the next of the same key
        _warm_optimizer()

    def run(self, request: dict, on_step=None) -> ProbeResult:
        probe = ProbeSection.model_validate(request["probe"])
        policy = Policy.from_dict(request["policy"])
        if request.get("standard"):
            return self.read_standard(policy.clip_grad)
        leg = Leg.from_dict(request.get("leg"))
        with _injected(fault_for(request.get("trial"))), trace.span("probe"):
            result = runner.run_probe(self.cfg, probe, policy, self.data, self.backend, self.device, on_step,
                                      target=self.space.model.target(), leg=leg, init=self.start,
                                      models=self.models, held_bytes=self._held_bytes())
        if self._reads_damage(request) and not result.diverged:
            with trace.span("fixed-state reading"):
                result.damage = self.damage_reader().read(policy)
        return result

    def read_standard(self, clip_grad: float | None) -> ProbeResult:
        """The standard FP8 recipe's fixed-state reading at ``clip_grad`` (no probe of its own: a result holding the
        reading alone, its description as ``damage["recipe"]``); ``damage`` None where no standard recipe runs on
        this backend (:mod:`precsearch.probe.damage.standard`)."""
        recipe = {name: knob.fixed for name, knob in self.space.search.recipe if knob.is_fixed}
        chosen = standard_policy(recipe, self.backend.supported_precisions(self.device), clip_grad,
                                 self.space.baseline_knobs(), self.space.probe.param_dtype)
        result = ProbeResult(device=str(self.device))
        if chosen is not None:
            with trace.span("standard FP8 reading"):
                result.damage = self.damage_reader().read(chosen[0]) | {"recipe": chosen[1]}
        return result

    def _held_bytes(self) -> int:
        """Device memory this process keeps between probes: the reader's BF16 side (not the probe's memory)."""
        return self._damage.device_bytes() if self._damage is not None else 0

    def _reads_damage(self, request: dict) -> bool:
        """A trial's probe in a study read by ``damage`` (references and stress probes are not read; a promoted
        trial is read again at the same states of the space's probe, which gives its first rung's reading)."""
        return request.get("trial") is not None and get_reading(self.space.objectives.reading).fixed_states

    def damage_reader(self) -> DamageReader:
        """The space's fixed-state reader, made at the first trial it reads (its BF16 side is kept)."""
        if self._damage is None:
            self._damage = DamageReader(self.cfg, self.space.probe, self.data, self.backend, self.device,
                                        self.space.objectives.damage, self.start, self.space.baseline_knobs(),
                                        models=self.models)
        return self._damage


def _warm_optimizer() -> None:
    """Make one AdamW now: torch's first optimizer imports ``torch._dynamo`` (0.9 s on a CPU core), which
    then happens while the worker opens its stores, not in the first probe's build."""
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])


def fault_for(trial: int | None) -> str | None:
    """The fault ``PRECSEARCH_FAULTS`` assigns to ``trial``, if any."""
    spec = os.environ.get(FAULTS_ENV, "")
    for item in filter(None, (s.strip() for s in spec.split(","))):
        number, _, kind = item.partition(":")
        if trial is not None and number.strip() == str(trial) and kind in FAULT_KINDS:
            return kind
    return None


@contextmanager
def _injected(kind: str | None):
    if kind == "raise":
        raise RuntimeError("injected fault: the probe raised")
    if kind == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB (injected fault)")
    if kind in ("kill", "segv"):
        os.kill(os.getpid(), signal.SIGKILL if kind == "kill" else signal.SIGSEGV)
    if kind != "nan":
        yield
        return
    original = runner._probe_model  # built afresh or taken from the model cache: poisoned either way
    hooks = []

    def poisoned(*args, **kwargs):
        model = original(*args, **kwargs)
        hooks.append(model.output_layer.register_forward_hook(lambda module, inputs, output: output * float("nan")))
        return model

    runner._probe_model = poisoned
    try:
        yield
    finally:
        runner._probe_model = original
        for hook in hooks:  # a kept model must not carry the fault into the next probe
            hook.remove()
