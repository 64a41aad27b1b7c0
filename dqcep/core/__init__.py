"""What every layer of dqcep shares, below the language: the event (``events``), the
column batch events travel in (``batch``), the lookup-table rule every engine reads
rows by (``tables``), the limits every number at the edge is checked against
(``limits``), and the one error a user sees as a line (``errors``)."""
