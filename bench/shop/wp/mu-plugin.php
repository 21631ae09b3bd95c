<?php
/**
 * Plugin Name: promreflex bench shop
 * Description: Lets load-test visitors (all from 127.0.0.1) post reviews, as real visitors from
 * many addresses could: WordPress's comment-flood check (one comment per IP per 15 s) is off.
 * The canonical redirect is off (see below). Everything else is stock WordPress.
 */
remove_action('check_comment_flood', 'check_comment_flood_db', 10);
add_filter('wp_is_comment_flood', '__return_false', 99);
// The shop is reached at 127.0.0.1:<port>; WordPress's canonical redirect drops the port from
// the requested URL it compares with and then redirects every page to itself (301 loop).
remove_action('template_redirect', 'redirect_canonical');
