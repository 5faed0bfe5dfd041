"""numpy imported at its first use (servescope/judgements/numpy_on_use.py): the same names, numpy left unloaded until then."""

from __future__ import annotations

from tests.harness import in_a_fresh_interpreter


def test_numpy_is_imported_at_the_first_name_read_and_its_names_are_numpys():
    probe = (
        "import sys\n"
        "from servescope.judgements import stats\n"
        "from servescope.judgements.numpy_on_use import numpy as np\n"
        "print('numpy' in sys.modules, stats.median([3, None, 1, 2]), stats.bootstrap_median_ci([0.5, None]))\n"
        "print('numpy' in sys.modules)\n"
        "a = np.asarray([3.0, 1.0, 2.0])\n"
        "import numpy\n"
        "print('asarray' in vars(np), np.asarray is numpy.asarray, isinstance(a, numpy.ndarray), np.ndarray is numpy.ndarray)\n"
        "print(np.random.default_rng is numpy.random.default_rng, np.__version__ == numpy.__version__)\n"
        "print(stats.median(a), stats.median(list(range(1, 2000))))\n"
    )
    assert in_a_fresh_interpreter(probe).splitlines() == [
        "False 2.5 (0.5, 0.5, 0.5)",  # a short list's median and one value's interval: no array, no numpy
        "False",
        "True True True True",  # the first name read imported numpy; the names are numpy's own, then plain lookups
        "True True",
        "2.0 1000.0",
    ]
