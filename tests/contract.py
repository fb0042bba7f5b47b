"""The public contract's JSON shapes (fields may be added, never renamed).

One copy for every test that checks a shape.
"""

ENTRY_KEYS = frozenset(
    {
        "id",
        "task_key",
        "trigger",
        "dedup_key",
        "due",
        "status",
        "attempt",
        "max_attempts",
        "parent_id",
        "run_ids",
        "lease_expires_at",
        "failure_kind",
        "error",
        "operator",
        "reason",
        "manual_retry_by",
        "manual_retry_at",
        "created_at",
        "updated_at",
        "summary",
    }
)
SUMMARY_LISTS = frozenset({"late_job_rejections", "dispatch_failures", "hooks"})
