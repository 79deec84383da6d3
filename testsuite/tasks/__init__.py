"""KernelBench-format tasks written for kstrata: `level1/` single ops, `level2/` fused chains, `models/` small models.

Each task is a standalone file defining `Model`, `get_inputs` and `get_init_inputs`, exactly as a
KernelBench problem does; `kstrata.agents.tasks.load_task` loads one, `kstrata task show` describes it.
"""

from pathlib import Path

#: The folder holding the task files.
TASKS_DIR = Path(__file__).resolve().parent
