"""The audit trail: every training batch and every policy version, so anyone can recompute
the behaviour log-probs and confirm that each batch obeyed its synchronization strategy
(``lockstep audit RUN_DIR``). The files are described by ``FORMAT`` (also written to
``audit/README.md``); what passes is described by ``IterationAudit.failures``.
"""

from lockstep.audit.check import AuditError, AuditReport, IterationAudit, check, format_report, main
from lockstep.audit.writer import FORMAT, UNBOUNDED, AuditWriter

__all__ = ["FORMAT", "UNBOUNDED", "AuditError", "AuditReport", "AuditWriter", "IterationAudit", "check",
           "format_report", "main"]
