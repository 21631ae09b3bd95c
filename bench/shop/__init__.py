"""A real PHP web shop (WordPress, php-fpm, MariaDB, nginx from Debian's packages) for the
copy-guard bench: see :mod:`bench.shop.wordpress`."""
