<?php
/**
 * Install WordPress into the private database and add the shop's products (run by php-cli from
 * bench/shop/wordpress.py, never by the web server): wp_install(), then PRODUCTS posts with
 * product-like content in the "products" category, comments open. Prints one JSON line with the
 * post ids and the search words, which the load profile draws from. Every product gets
 * REVIEWS approved reviews up front: a product page lists at most 20, so with 20 or more the
 * cost of a page no longer grows as the load posts reviews (the bench also deletes the reviews a
 * run posted before the next run: every run meets the same shop).
 *
 * argv: docroot, site URL, number of products, random seed, reviews per product.
 */
if (PHP_SAPI !== 'cli') { exit(1); }
[$self, $docroot, $url, $products, $seed, $reviews] = $argv;
define('WP_INSTALLING', true);
$_SERVER['HTTP_HOST'] = parse_url($url, PHP_URL_HOST) . ':' . parse_url($url, PHP_URL_PORT);
$_SERVER['REQUEST_URI'] = '/';
require $docroot . '/wp-load.php';
require_once ABSPATH . 'wp-admin/includes/upgrade.php';
require_once ABSPATH . 'wp-includes/wp-db.php';

$result = wp_install('promreflex shop', 'shopadmin', 'shopadmin@example.invalid', false, '', wp_generate_password(24));
update_option('template', 'promreflex-shop');
update_option('stylesheet', 'promreflex-shop');
update_option('posts_per_page', 10);
update_option('comment_moderation', 0);
update_option('comment_previously_approved', 0);
update_option('require_name_email', 1);
update_option('close_comments_for_old_posts', 0);
update_option('blog_public', 0);

mt_srand((int) $seed);
$adjectives = ['oak', 'linen', 'copper', 'walnut', 'wool', 'steel', 'ceramic', 'bamboo', 'leather', 'glass',
               'cotton', 'marble', 'cedar', 'brass', 'velvet', 'granite', 'maple', 'silk', 'slate', 'birch'];
$nouns = ['chair', 'table', 'lamp', 'kettle', 'blanket', 'shelf', 'mug', 'rug', 'stool', 'vase',
          'desk', 'bench', 'pillow', 'clock', 'mirror', 'basket', 'bowl', 'teapot', 'cabinet', 'sofa'];
$filler = ['handmade', 'durable', 'finish', 'warranty', 'delivery', 'assembly', 'natural', 'sustainable',
           'size', 'colour', 'care', 'instructions', 'stock', 'returns', 'gift', 'classic', 'modern', 'compact',
           'weight', 'material', 'sourced', 'crafted', 'design', 'studio', 'collection', 'season', 'edition'];
$cat = wp_create_category('products');
$ids = [];
for ($i = 1; $i <= (int) $products; $i++) {
    $adj = $adjectives[mt_rand(0, count($adjectives) - 1)];
    $noun = $nouns[mt_rand(0, count($nouns) - 1)];
    $paras = [];
    for ($p = 0; $p < 12; $p++) {
        $words = [];
        for ($w = 0; $w < 60; $w++) {
            $pool = mt_rand(0, 9) === 0 ? (mt_rand(0, 1) ? $adjectives : $nouns) : $filler;
            $words[] = $pool[mt_rand(0, count($pool) - 1)];
        }
        $paras[] = '<p>' . ucfirst(implode(' ', $words)) . '.</p>';
    }
    $price = sprintf('%d.%02d', mt_rand(5, 900), mt_rand(0, 99));
    $ids[] = wp_insert_post([
        'post_title' => sprintf('Product %d: %s %s', $i, ucfirst($adj), $noun),
        'post_content' => "<p><strong>Price: EUR $price</strong></p>\n" . implode("\n", $paras),
        'post_status' => 'publish',
        'post_category' => [$cat],
        'comment_status' => 'open',
        'tags_input' => [$adj, $noun],
    ]);
}
global $wpdb;
$wpdb->query('START TRANSACTION');
foreach ($ids as $id) {
    for ($r = 1; $r <= (int) $reviews; $r++) {
        wp_insert_comment(['comment_post_ID' => $id, 'comment_author' => "buyer $r", 'comment_author_email' => "buyer$r@example.invalid",
                           'comment_content' => "Review $r of product $id: " . $filler[mt_rand(0, count($filler) - 1)] . ', as described.',
                           'comment_approved' => 1]);
    }
}
$wpdb->query('COMMIT');
$max_comment = (int) $wpdb->get_var("SELECT COALESCE(MAX(comment_ID), 0) FROM $wpdb->comments");
echo json_encode(['post_ids' => $ids, 'words' => array_merge($adjectives, $nouns), 'max_comment_id' => $max_comment]), "\n";
