"""Host-side helpers for the Ansible modules in ``library/``.

Shipped to hosts as module_utils (``ansible.module_utils.gpuk8s.ansible...``), so,
like ``core`` and ``discovery``, this package uses relative imports and the stdlib.
The one exception is ``schedfiles``, which needs ruamel.yaml on the host for
comment-preserving YAML round trips; it imports it guardedly and the module reports a
missing library with ``missing_required_lib``. Nothing here imports ``AnsibleModule``:
the modules' ``main()`` is the only place that talks to Ansible.
"""
