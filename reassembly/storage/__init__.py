"""The storage adapters: where the cores' state meets files and databases (I/O by place).

The cores (:mod:`reassembly.assembler`, :mod:`reassembly.collector`, ...) open no file and no
connection; the modules here do, for them:

``sql``
    the database under every table set: a SQLite file or a PostgreSQL server, one transaction at
    a time, one spelling of the SQL;
``collector``
    the collector's tables: its rules, the messages it holds, its batches and leases;
``durable``
    the durable collector: the collector core over those tables and batch files;
``ledger``
    the claim check's reference ledger, a table of its own (:mod:`reassembly.claimcheck` reads it);
``filestore``
    the assembler's file body store: message bodies written piece by piece into files.

Nothing is imported here, so a caller that needs the file store loads no database driver.
"""
