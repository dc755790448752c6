"""`tkbox verify` counts the secrets door's records in its summary."""

from __future__ import annotations

from tkbox.verify.cli import render
from tkbox.verify.core import Report


def test_summary_counts_secret_uses_leaks_and_model_calls() -> None:
    r = Report(run="r", records=9, isolation="same-user", assurance="dev", origin="o",
               log_key="k", tree_size=9, root_hash="h", cosigned_by=(),
               kinds={"tkbox.secret.use": 3, "tkbox.secret.leak": 1, "tkbox.model.call": 2,
                      "tkbox.decision": 3})
    j = r.to_json()
    assert (j["secret_uses"], j["secret_leaks"], j["model_calls"]) == (3, 1, 2)
    assert "Secrets: 3 uses, 1 leaks blocked; model calls: 2" in render(r)
