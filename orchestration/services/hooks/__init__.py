"""Plugin hooks: listeners around task creation and execution that cannot break scheduling.

A plugin ships *listeners* (functions of one :class:`HookContext`) for named events:

- ``before_task_create``: before a schedule/sensor/manual request for a task run is
  emitted. A listener returns :func:`allow`, :func:`deny` (reason) or :func:`degrade`
  (extra run tags). A deny is honored only from a listener declared ``blocking=True``;
  from any other listener it is recorded as ``deny_ignored`` and the run goes ahead.
- ``after_task_create``: the request was emitted (schedule/sensor) or the run submitted
  (manual launch).
- ``task_before`` / ``task_after`` / ``task_failed``: around the task body, after the run
  claimed its ledger entry (a duplicate or late run fires nothing: it does nothing).
- ``tick.every_slot``, ``tick.every_minute``, ``tick.every_five_minutes``: once per slot,
  fired by the slot tick tasks (``assets/slot_ticks.py``). The two legacy names keep their
  names but, like every dueledger schedule, fire at most once per slot.
- ``before_renewal_first_notice``: before the first renewal notice of a service's expiry
  is sent (``billing_maintenance``); the context's ``data`` names the service, customer,
  expiry, stage and channels. A deny from a blocking listener skips that notice.

Registration: entry points in group ``dueledger.hooks`` (see :func:`load_hooks`) plus an
optional TOML file named by ``DUELEDGER_HOOKS_FILE``. One :class:`Hooks` object per process
(built by ``orchestration/definitions.py`` and by the CLI) loads them on first use and is
passed to whatever fires an event; nothing is kept in a module. A plugin that fails to load is
recorded as a load error (logs, `dueledger hooks`), never raised.

Isolation: every listener call runs in its own thread, inside its own try/except, joined
with the listener's timeout. An exception, an invalid return value or a timeout becomes an
outcome (``error`` / ``invalid`` / ``timeout``) and the next listener runs; the scheduler and
the task go on. A timed-out listener thread cannot be killed in Python: it is abandoned (a
daemon thread) and whatever it does later is ignored. Timeouts fail open: a blocking
listener that times out or raises does not deny.

Every outcome is logged as one JSON object per line (logger ``dueledger.hooks``, and the
Dagster run/tick log when there is one) and stored, bounded, on the run's ledger entry
(``summary.hooks``). This package does not import Dagster; ``orchestration/task_defs.py``
(schedules and runs), ``orchestration/manual_launch.py``, ``orchestration/services/task_events.py``
and ``assets/billing/tasks.py`` (``billing_maintenance``) fire the events.

Modules: ``vocabulary`` (events, outcomes, results, context, listeners, the loaded registry),
``loading`` (entry points and the config file), ``firing`` (isolation and timeouts),
``records`` (outcomes on the ledger entry and in the ``dueledger/hooks`` tag), ``creation``
(the ``before/after_task_create`` gate) and ``registry`` (the :class:`Hooks` object).
"""
