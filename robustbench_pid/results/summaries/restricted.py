"""Tidy rows of the ``restricted`` benchmark (ImageNet-A/-R, logits restricted to 200 classes):
top-1/top-5 with Wilson intervals and the unreadable-image count."""
from __future__ import annotations

from typing import Optional

import pandas as pd

from . import summarizers
from .accuracy import accuracy_rows, concat_rows, skipped_rows


@summarizers.register("restricted")
def restricted_rows(records: pd.DataFrame, ce_baseline: Optional[str] = None) -> pd.DataFrame:
    return concat_rows([accuracy_rows(records, ("attack", "eps")), skipped_rows(records)])
