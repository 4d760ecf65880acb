# Two commands do all the set-up on a fresh machine:
#   make demo   # venv + install + the main job on the BugFix gym, then a short SFT+GRPO run
#   make test   # venv + install + the test suite
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.agentrl-installed
EXTRAS ?= hf,ray,dev,serve

# the interop tests run the real TRL, verl and OpenRLHF in their own venv (verl pins transformers < 5.11)
IVENV  ?= .venv-interop
IPY    := $(IVENV)/bin/python
ISTAMP := $(IVENV)/.agentrl-installed

.PHONY: install demo test test-interop bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	rm -rf runs/demo
	$(VENV)/bin/agentrl rollout --out runs/demo
	$(VENV)/bin/agentrl check runs/demo/trajectories --model runs/demo/model.pt
	$(VENV)/bin/agentrl train --sft-steps 150 --grpo-steps 20 --group 8 --out runs/demo/train
	$(VENV)/bin/agentrl rollout --policy model --checkpoint runs/demo/train/model.pt --out runs/demo/trained
	$(VENV)/bin/agentrl report runs/demo
	$(VENV)/bin/agentrl report runs/demo/trained

test: $(STAMP)
	$(PY) -m pytest -q
	$(MAKE) test-interop

$(ISTAMP): pyproject.toml
	test -x $(IPY) || python3 -m venv $(IVENV)
	$(IPY) -m pip install -q torch==2.13.0
	$(IPY) -m pip install -q -e '.[hf,dev,interop]'
	$(IPY) -m pip install -q --no-deps verl==0.9.1 openrlhf==0.11.2
	touch $(ISTAMP)

test-interop: $(ISTAMP)
	$(IPY) -m pytest -q tests/interop

bench: $(STAMP)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) $(IVENV) runs .pytest_cache .hypothesis
